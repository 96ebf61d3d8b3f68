"""The fast backend: the C scanner (``_scan.c``) over the reader's chunks, into numpy columns.

:func:`scan` returns None, so that the Arrow backend takes over, when the scanner is not built or
the file strays from plain Horovod output (escaped strings, fractional numbers, garbage).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hvd_magic.errors import TimelineError
from hvd_magic.timeline.store import StoreBuilder, keep_largest

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Columns", "Digest", "columns", "scan"]

ABSENT = np.iinfo(np.int64).min
START = "start_time_since_epoch_in_micros"

# What _scan.scan returns for one chunk, after (consumed, error_at): ph, name ids, ts, pid, dur
# as bytes, the chunk's distinct names, (event index, raw args) of its metadata events, and
# (event index, tensor bytes) int64 pairs of the events that end an operation on a tensor.
Part = tuple[bytes, bytes, bytes, bytes, bytes, list[str], list[tuple[int, bytes]], bytes]


@dataclass
class Columns:
    """The events as numpy columns: ``name`` holds ids into ``names`` (-1: none), integers hold
    ``ABSENT`` where an event has no such field; ``meta`` is (row, args) of each ``M`` event."""

    ph: np.ndarray
    name: np.ndarray
    ts: np.ndarray
    pid: np.ndarray
    dur: np.ndarray
    names: list[str]
    meta: list[tuple[int, dict[str, Any]]]
    truncated: bool

    def __len__(self) -> int:
        return len(self.ph)

    def metadata_rows(self) -> Iterator[tuple[str | None, int | None, dict[str, Any]]]:
        """(name, pid, args) of each ``M`` event."""
        for row, args in self.meta:
            name_id, pid = int(self.name[row]), int(self.pid[row])
            yield (self.names[name_id] if name_id >= 0 else None), (None if pid == ABSENT else pid), args

    def table(self) -> pa.Table:
        """The Arrow table of ``schema.SCHEMA`` over the columns (integers without copies)."""
        import pyarrow as pa

        from hvd_magic.timeline.schema import SCHEMA

        codes, index = np.unique(self.ph, return_inverse=True)
        return pa.table(
            {
                "ph": pa.DictionaryArray.from_arrays(
                    pa.array(index.astype(np.int32)), [chr(c) for c in codes]
                ),
                "name": pa.DictionaryArray.from_arrays(
                    pa.array(np.maximum(self.name, 0), mask=self.name < 0), pa.array(self.names, pa.string())
                ),
                **{key: pa.array(column, mask=column == ABSENT) for key, column in self._integers().items()},
                "args": self._args(),
            }
        ).select(SCHEMA.names)

    def _integers(self) -> dict[str, np.ndarray]:
        return {"ts": self.ts, "dur": self.dur, "pid": self.pid}

    def _args(self) -> pa.StructArray:
        """The args that ``schema.SCHEMA`` keeps, for ``M`` events (null for the others)."""
        import pyarrow as pa

        from hvd_magic.timeline.schema import SCHEMA

        tensor = np.full(len(self), None, dtype=object)
        start = np.full(len(self), None, dtype=object)
        for row, args in self.meta:
            tensor[row] = args["name"] if isinstance(args.get("name"), str) else None
            start[row] = args[START] if isinstance(args.get(START), int) else None
        return pa.StructArray.from_arrays(
            [pa.array(tensor, pa.string()), pa.array(start, pa.int64())],
            fields=list(SCHEMA.field("args").type),
            mask=pa.array(self.ph != ord("M")),
        )


def scan(
    chunks: Iterable[tuple[int, memoryview, bool, bool]], workers: int, consume: Callable[[Part], None]
) -> bool | None:
    """Scans the chunks a few at a time, side by side (the scanner releases the GIL), and hands
    each chunk's columns to ``consume`` in file order. Returns whether the last event was cut
    off, or None when the scanner is not built or the file is not plain Horovod output."""
    try:
        from hvd_magic.timeline import _scan
    except ImportError:
        return None
    truncated = False
    with ThreadPoolExecutor(workers) as pool:
        pending: collections.deque[tuple[memoryview, bool, Future[Any]]] = collections.deque()

        def take_one() -> bool:
            nonlocal truncated
            view, last, future = pending.popleft()
            result = future.result()
            consumed, error_at = result[0], result[1]
            if error_at >= 0 or (consumed < len(view) and not last):
                return False  # not plain Horovod output: the Arrow backend says where
            if last:
                truncated = bool(bytes(view[consumed:]).strip(b" \n\r\t,"))
            consume(result[2:])
            return True

        for _, view, last, _closed in chunks:
            pending.append((view, last, pool.submit(_scan.scan, view, last)))
            while len(pending) > workers:
                if not take_one():
                    return None
        while pending:  # the last few (all of them when no chunk is the file's last)
            if not take_one():
                return None
    return truncated


def columns(chunks: Iterable[tuple[int, memoryview, bool, bool]], workers: int) -> Columns | None:
    """Every event, as columns (``Timeline.events`` asks for them)."""
    parts: list[Part] = []
    truncated = scan(chunks, workers, parts.append)
    return None if truncated is None else _assemble(parts, truncated)


class Digest:
    """What ``read`` keeps of each chunk: its spans (fed to a matcher), cycle marks, metadata
    rows and the count of events; the chunk's columns are dropped once fed."""

    def __init__(self) -> None:
        self.vocabulary: dict[str, int] = {}
        self.builder = StoreBuilder()
        self.meta: list[tuple[str | None, int | None, dict[str, Any]]] = []
        self.tensor_bytes: dict[int, int] = {}  # by pid, where Horovod wrote dtype and shape
        self.events = 0

    def __call__(self, part: Part) -> None:
        ph, ids, ts, pid, _dur, names, chunk_meta, sizes = part
        name = global_ids(self.vocabulary, names, ids)
        ts_column, pid_column = np.frombuffer(ts, np.int64), np.frombuffer(pid, np.int64)
        self.builder.add(
            np.frombuffer(ph, np.uint8), name, ts_column, pid_column, self.vocabulary.get("CYCLE_START")
        )
        known = self.names if chunk_meta else []
        for index, args in chunk_meta:
            label, tensor = int(name[index]), int(pid_column[index])
            row = (
                known[label] if label >= 0 else None,
                None if tensor == ABSENT else tensor,
                meta_args(args),
            )
            self.meta.append(row)
        if sizes:
            pairs = np.frombuffer(sizes, np.int64).reshape(-1, 2)
            keep_largest(self.tensor_bytes, pid_column[pairs[:, 0]], pairs[:, 1])
        self.events += len(ph)

    @property
    def names(self) -> list[str]:
        """Names by id."""
        return list(self.vocabulary)


def meta_args(raw: bytes | str) -> dict[str, Any]:
    """A metadata event's ``args``: a JSON object (anything else counts as none); a
    TimelineError where it is not JSON."""
    try:
        args = json.loads(raw)
    except ValueError:
        raise TimelineError(
            f"not a Horovod Timeline: a metadata event's args are not JSON: {raw[:80]!r}"
        ) from None
    return args if isinstance(args, dict) else {}


def global_ids(vocabulary: dict[str, int], names: list[str], ids: bytes) -> np.ndarray:
    """A chunk's name ids (into its own ``names``) as ids into ``vocabulary``, which grows by
    the names it has not seen; -1 (no name) stays -1."""
    local = np.array([vocabulary.setdefault(n, len(vocabulary)) for n in names] + [-1], np.int32)
    named: np.ndarray = local[np.frombuffer(ids, np.int32)]  # id -1 picks the trailing -1
    return named


def _assemble(parts: list[Part], truncated: bool) -> Columns:
    """One set of columns from the chunks' own: one vocabulary of names, rows counted across."""
    vocabulary: dict[str, int] = {}
    columns: dict[str, list[np.ndarray]] = {"ph": [], "name": [], "ts": [], "pid": [], "dur": []}
    meta: list[tuple[int, dict[str, Any]]] = []
    rows = 0
    for ph, ids, ts, pid, dur, names, chunk_meta, _sizes in parts:
        columns["ph"].append(np.frombuffer(ph, np.uint8))
        columns["name"].append(global_ids(vocabulary, names, ids))
        for key, raw in (("ts", ts), ("pid", pid), ("dur", dur)):
            columns[key].append(np.frombuffer(raw, np.int64))
        meta.extend((rows + index, meta_args(args)) for index, args in chunk_meta)
        rows += len(ph)
    dtypes = {"ph": np.uint8, "name": np.int32}
    merged = {
        key: np.concatenate(chunks) if chunks else np.empty(0, dtypes.get(key, np.int64))
        for key, chunks in columns.items()
    }
    names_by_id = sorted(vocabulary, key=vocabulary.__getitem__)
    return Columns(**merged, names=names_by_id, meta=meta, truncated=truncated)
