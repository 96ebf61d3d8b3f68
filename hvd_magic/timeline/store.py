"""Every span of a timeline in compact columns, the form the viewer and the analysis work on.

The reader feeds the events to a matcher chunk by chunk as it scans, and keeps only this: spans
sorted by row (a tensor; rows ordered by tensor name) and start, the readiness marks of the spans
that had any, and the cycle marks. No per-event column outlives the scan, so a 3 GB file costs
its spans, not its events. A span takes about 16 bytes: its start in 64 bits, and each other
column in the fewest bits its values need (durations in 32 unless a span lasts 71 minutes or
more; rows and kinds in 8 or 16 unless there are more than 65,536), chosen from the data, so
that any file reads right and a typical one small.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from hvd_magic.timeline.matching import Matched, Matcher, matched, new_matcher
from hvd_magic.timeline.matching import tensors as matched_tensors

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SpanStore", "StoreBuilder", "keep_largest"]

UNNAMED = "(unnamed)"
CHUNK = 1 << 20  # spans mapped at a time (bounds the scratch memory)


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
    row: np.ndarray  # uint8, uint16 or uint32 (smallest_uint)
    start: np.ndarray  # int64, µs
    duration: np.ndarray  # uint32, or int64 when a span does not fit
    kind: np.ndarray  # uint8, uint16 or uint32
    depth: np.ndarray  # uint8
    offsets: np.ndarray  # int64
    max_duration: np.ndarray  # per row: how far before a window a span that reaches into it starts
    ready_row: np.ndarray
    ready_kind: np.ndarray
    ready_depth: np.ndarray
    ready_start: np.ndarray
    ready_rank: np.ndarray  # int32: the rank ready last, an index into ranks (-1: a mark without a name)
    ready_wait: np.ndarray
    cycles: np.ndarray  # CYCLE_START times, sorted
    ranks: list[str]  # the names of all rank-ready marks (the ranks, "0", "1", ...)
    first_start: int = 0  # the earliest start and the latest end (0 without spans)
    last_end: int = 0
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
                return pd.DataFrame(columns=["pid", "name", "start", "end", "duration", "depth", "tensor"])
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
                    "duration": self.duration[order].astype(np.int64),
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
        pids, closed = matched_tensors(self.matcher)
        present = np.flatnonzero(closed)  # the tensors with spans: one row each
        row_tensors = [tensors.get(int(p)) for p in pids[present]]
        labels = [t if t is not None else f"pid {p}" for t, p in zip(row_tensors, pids[present], strict=True)]
        by_name = sorted(range(len(present)), key=lambda i: (labels[i], int(pids[present[i]])))
        spans = matched(self.matcher, present[by_name], more)
        counts = closed[present[by_name]]
        offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
        if not spans.in_order:
            _sort_rows(spans, offsets)
        kind_of, kind_names = _kinds(spans.name, names)
        kind = _lookup(kind_of, spans.name)
        row_of_ready = np.searchsorted(offsets, spans.ready_span, side="right") - 1
        rank_of, ranks = self._ranks(names)
        return SpanStore(
            row_pids=pids[present[by_name]],
            row_names=[labels[i] for i in by_name],
            row_tensors=[row_tensors[i] for i in by_name],
            row_bytes=np.array([sizes.get(int(pids[present[i]]), 0) for i in by_name], np.int64),
            kind_names=kind_names,
            row=np.repeat(np.arange(len(counts), dtype=smallest_uint(len(counts))), counts),
            start=spans.start,
            duration=spans.duration,
            kind=kind,
            depth=spans.depth,
            offsets=offsets,
            max_duration=_longest(spans.duration, offsets),
            ready_row=row_of_ready,
            ready_kind=kind[spans.ready_span],
            ready_depth=spans.depth[spans.ready_span],
            ready_start=spans.start[spans.ready_span],
            ready_rank=_lookup(rank_of, spans.ready_name),
            ready_wait=spans.ready_wait,
            cycles=np.sort(np.concatenate(self.cycles)) if self.cycles else np.empty(0, np.int64),
            ranks=ranks,
            **_extent(spans.start, spans.duration, offsets),
        )

    def _ranks(self, names: list[str]) -> tuple[np.ndarray, list[str]]:
        """The names of the rank-ready marks, as ranks sort ("2" before "10"), and the lookup
        from name id + 1 to their index (-1: a mark without a name)."""
        marked = np.flatnonzero(self.marked)
        ranked = sorted(range(len(marked)), key=lambda i: (len(names[marked[i]]), names[marked[i]]))
        lookup = np.full(len(names) + 1, -1, np.int32)
        lookup[marked[ranked] + 1] = np.arange(len(ranked))
        return lookup, [names[marked[i]] for i in ranked]


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


def smallest_uint(count: int) -> type[np.unsignedinteger]:
    """The narrowest unsigned integer type that holds 0 .. count - 1 (rows, kinds)."""
    return next(t for t in (np.uint8, np.uint16, np.uint32) if count <= np.iinfo(t).max + 1)


def _kinds(name: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """A kind per distinct span name, sorted by name; the lookup from name id + 1 to kind."""
    present = np.zeros(len(names) + 1, bool)
    for lo in range(0, len(name), CHUNK):
        present[name[lo : lo + CHUNK] + 1] = True
    used = np.flatnonzero(present) - 1
    labels = [names[i] if i >= 0 else UNNAMED for i in used.tolist()]
    ranked = sorted(range(len(used)), key=labels.__getitem__)
    lookup = np.zeros(len(names) + 1, smallest_uint(len(used)))
    lookup[used[ranked] + 1] = np.arange(len(ranked))
    return lookup, [labels[i] for i in ranked]


def _lookup(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``table[ids + 1]``, a piece at a time (no full-length temporary)."""
    out = np.empty(len(ids), table.dtype)
    for lo in range(0, len(ids), CHUNK):
        out[lo : lo + CHUNK] = table[ids[lo : lo + CHUNK] + 1]
    return out


def _longest(duration: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each row's longest span (spans are by row: one reduction per row's run)."""
    longest = np.zeros(len(offsets) - 1, np.int64)
    filled = np.flatnonzero(np.diff(offsets))
    if len(filled):
        longest[filled] = np.maximum.reduceat(duration, offsets[filled])
    return longest


def _extent(start: np.ndarray, duration: np.ndarray, offsets: np.ndarray) -> dict[str, int]:
    """The first start (rows begin with their earliest) and the last end, a piece at a time."""
    if not len(start):
        return {"first_start": 0, "last_end": 0}
    last_end = max(
        int((start[lo : lo + CHUNK] + duration[lo : lo + CHUNK]).max()) for lo in range(0, len(start), CHUNK)
    )
    firsts = offsets[:-1][np.diff(offsets) > 0]
    return {"first_start": int(start[firsts].min()), "last_end": last_end}


def _sort_rows(spans: Matched, offsets: np.ndarray) -> None:
    """Each row's spans by start (equal starts in file order), for a file that does not write
    each tensor's events in time order (Horovod does: then this is not needed)."""
    row = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    order = np.lexsort((spans.start, row))
    spans.start, spans.duration, spans.name, spans.depth = (
        c[order] for c in (spans.start, spans.duration, spans.name, spans.depth)
    )
    placed = np.empty_like(order)
    placed[order] = np.arange(len(order))
    spans.ready_span = placed[spans.ready_span]
