"""Every span of a timeline in compact columns, the form the viewer and the analysis work on.

The reader feeds the events to a matcher chunk by chunk as it scans, and keeps only this: spans
sorted by row (a tensor; rows ordered by tensor name) and start, about 24 bytes a span, the
readiness marks of the spans that had any, and the cycle marks. No per-event column outlives
the scan, so a 3 GB file costs its spans, not its events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .matching import ABSENT, Matcher, matched, new_matcher

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SpanStore", "StoreBuilder", "keep_largest"]

UNNAMED = "(unnamed)"


@dataclass
class SpanStore:
    """Spans by row then start (microseconds); ``kind`` indexes ``kind_names``, ``row`` indexes
    ``row_names`` and ``row_pids``; rows ``r``'s spans are ``offsets[r]:offsets[r + 1]``.

    ``ready_*``: one entry per span that had rank-ready marks (its row, kind, depth, start, the
    rank ready last and how long the others had waited for it).
    """

    row_pids: np.ndarray
    row_names: list[str]
    row_tensors: list[str | None]  # the tensor named in the metadata, None for an unnamed pid
    row_bytes: np.ndarray  # the tensor's size where Horovod wrote its dtype and shape, else 0
    kind_names: list[str]
    row: np.ndarray
    start: np.ndarray
    duration: np.ndarray
    kind: np.ndarray
    depth: np.ndarray
    offsets: np.ndarray
    max_duration: np.ndarray  # per row: how far before a window a span that reaches into it starts
    ready_row: np.ndarray
    ready_kind: np.ndarray
    ready_depth: np.ndarray
    ready_start: np.ndarray
    ready_rank: list[str]
    ready_wait: np.ndarray
    cycles: np.ndarray  # CYCLE_START times, sorted
    ranks: list[str]  # the names of all rank-ready marks (the ranks, "0", "1", ...)
    _frame: pd.DataFrame | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.start)

    @property
    def end(self) -> np.ndarray:
        end: np.ndarray = self.start + self.duration
        return end

    def kinds_where(self, test: str | tuple[str, ...], *, contains: bool = False) -> np.ndarray:
        """A boolean per kind: its name starts with (or contains) one of ``test``."""
        tests = (test,) if isinstance(test, str) else test
        if contains:
            return np.array([any(t in name for t in tests) for name in self.kind_names], dtype=bool)
        return np.array([name.startswith(tests) for name in self.kind_names], dtype=bool)

    def frame(self) -> pd.DataFrame:
        """One row per span, by start: pid, name, start, end, duration, depth, tensor."""
        if self._frame is None:
            import pandas as pd

            if not len(self):
                return pd.DataFrame(columns=["pid", "name", "start", "end", "duration", "depth"])
            order = np.lexsort((self.row_pids[self.row], self.start))
            row = self.row[order]
            tensor_codes = np.array([-1 if t is None else i for i, t in enumerate(self.row_tensors)])
            tensors = [t if t is not None else "" for t in self.row_tensors]
            self._frame = pd.DataFrame(
                {
                    "pid": self.row_pids[row],
                    "name": pd.Categorical.from_codes(self.kind[order], self.kind_names),
                    "start": self.start[order],
                    "end": self.start[order] + self.duration[order],
                    "duration": self.duration[order],
                    "depth": self.depth[order].astype(np.int64),
                    "tensor": pd.Categorical.from_codes(tensor_codes[row], _distinct(tensors)),
                }
            )
        return self._frame


def _distinct(names: list[str]) -> list[str]:
    """Categories must be unique: a name two pids share gets the pid's position appended."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name} #{seen[name]}")
    return out


class StoreBuilder:
    """Takes the events chunk by chunk, in file order (name ids in one growing vocabulary)."""

    def __init__(self) -> None:
        self.matcher: Matcher = new_matcher()
        self.cycles: list[np.ndarray] = []
        self.marked = np.zeros(0, np.int64)  # per name id: how many X events carry it

    def add(
        self, ph: np.ndarray, name: np.ndarray, ts: np.ndarray, pid: np.ndarray, cycle_id: int | None
    ) -> None:
        self.matcher.feed(
            np.ascontiguousarray(ph, np.uint8).data,
            np.ascontiguousarray(name, np.int32).data,
            np.ascontiguousarray(ts, np.int64).data,
            np.ascontiguousarray(pid, np.int64).data,
        )
        if cycle_id is not None:
            self.cycles.append(ts[name == cycle_id])
        marks = name[ph == ord("X")]
        if len(marks):
            counts = np.bincount(marks[marks >= 0])
            if len(counts) > len(self.marked):
                self.marked = np.r_[self.marked, np.zeros(len(counts) - len(self.marked), np.int64)]
            self.marked[: len(counts)] += counts

    def finish(
        self, names: list[str], tensors: Mapping[int, str], sizes: Mapping[int, int], more: bool = False
    ) -> SpanStore:
        """The store of the events so far (names, bytes by pid); ``more``: open spans wait."""
        start, end, pid, name, depth, ready_span, ready_name, ready_wait = matched(self.matcher, more)
        # the spans with readiness marks, read before the unclosed ones are dropped
        r_pid, r_span_name, r_depth, r_start = (c[ready_span] for c in (pid, name, depth, start))
        closed = end != ABSENT
        if not closed.all():
            start, end, pid, name, depth = (c[closed] for c in (start, end, pid, name, depth))
        row_pids, row_of = _dense(pid)
        row_tensors = [tensors.get(int(p)) for p in row_pids]
        labels = [t if t is not None else f"pid {p}" for t, p in zip(row_tensors, row_pids, strict=True)]
        by_name = sorted(range(len(row_pids)), key=lambda i: (labels[i], int(row_pids[i])))
        position = np.empty(len(by_name), np.int64)
        position[by_name] = np.arange(len(by_name))
        row = position[row_of]
        order = _by_row_then_start(row, start)
        kind_of, kind_names = _kinds(name, names)
        row = row[order].astype(np.int32)
        duration = (end - start)[order]
        del end
        counts = np.bincount(row, minlength=len(by_name))
        offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
        longest = np.zeros(len(by_name), np.int64)
        filled = np.flatnonzero(counts)  # spans are by row: one reduction per row's run
        if len(filled):
            longest[filled] = np.maximum.reduceat(duration, offsets[filled])
        return SpanStore(
            row_pids=row_pids[by_name],
            row_names=[labels[i] for i in by_name],
            row_tensors=[row_tensors[i] for i in by_name],
            row_bytes=np.array([sizes.get(int(p), 0) for p in row_pids[by_name]], np.int64),
            kind_names=kind_names,
            row=row,
            start=start[order],
            duration=duration,
            kind=kind_of[name[order] + 1],
            depth=depth[order],
            offsets=offsets,
            max_duration=longest,
            ready_row=position[np.searchsorted(row_pids, r_pid)],
            ready_kind=kind_of[r_span_name + 1],
            ready_depth=r_depth,
            ready_start=r_start,
            ready_rank=[names[i] if i >= 0 else "?" for i in ready_name.tolist()],
            ready_wait=ready_wait,
            cycles=np.sort(np.concatenate(self.cycles)) if self.cycles else np.empty(0, np.int64),
            ranks=sorted((names[i] for i in np.flatnonzero(self.marked)), key=lambda r: (len(r), r)),
        )


def keep_largest(sizes: dict[int, int], pids: np.ndarray, reported: np.ndarray) -> None:
    """Adds reported tensor sizes to ``sizes`` (bytes by pid), keeping each pid's largest (the
    same at every step, but for allgathers)."""
    if not len(pids):
        return
    distinct, index = _dense(pids)
    largest = np.full(len(distinct), -1, np.int64)
    np.maximum.at(largest, index, reported)
    for pid, size in zip(distinct.tolist(), largest.tolist(), strict=True):
        sizes[pid] = max(size, sizes.get(pid, -1))


def _dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, sorted, and each value's index among them; a lookup table when the
    values are small integers (tensor pids are), a sort otherwise."""
    if not len(values):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    low, high = int(values.min()), int(values.max())
    if low >= 0 and high < 1 << 24:
        present = np.bincount(values, minlength=high + 1) > 0
        distinct = np.flatnonzero(present)
        index = np.cumsum(present) - 1
        return distinct.astype(np.int64), index[values]
    distinct, inverse = np.unique(values, return_inverse=True)
    return distinct, inverse


def _by_row_then_start(row: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The spans' order by row then start. Spans come in file order, which Horovod writes in
    time order per tensor: a stable sort by row (a linear radix sort on 16-bit rows) is enough,
    checked, with a full sort when a file is out of order."""
    if not len(row):
        return np.empty(0, np.int64)
    key = row.astype(np.int16) if row.max() < 1 << 15 else row
    order = np.argsort(key, kind="stable")
    ordered_start, ordered_row = start[order], row[order]
    if (np.diff(ordered_start)[np.diff(ordered_row) == 0] < 0).any():
        order = np.lexsort((start, row))
    return order


def _kinds(name: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """A kind per distinct span name, sorted by name; the lookup from name id + 1 to kind."""
    used = np.flatnonzero(np.bincount(name + 1, minlength=len(names) + 1)) - 1
    labels = [names[i] if i >= 0 else UNNAMED for i in used.tolist()]
    ranked = sorted(range(len(used)), key=labels.__getitem__)
    lookup = np.full(len(names) + 1, -1, np.int32)
    lookup[used[ranked] + 1] = np.arange(len(ranked), dtype=np.int32)
    return lookup, [labels[i] for i in ranked]
