"""The timeline reader: one front over two backends, both keeping only columns.

Horovod writes one JSON array of events, mostly without newlines (``},{`` between events), and a
killed run leaves it without its closing ``]`` or cut inside an event; releases before 0.20 never
wrote the ``]``. This module owns what both backends share: the opening check, the chunks (read
piece by piece, each ending right after an event's ``}``), the closing ``]``, the metadata (tensor
names, start time) and the :class:`Timeline`. Beneath it:

- ``_fast``: the C scanner (``_scan.c``), chunks scanned side by side into numpy columns;
- ``_arrow``: Arrow's JSON reader, for files that stray from plain Horovod output (escaped
  strings, fractional numbers) or are damaged; it names the byte where an event goes wrong.

Both drop an incomplete last event; garbage raises ``TimelineError`` naming the file and the byte
offset. Arrow is imported only when a table is asked for.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hvd_magic.errors import TimelineError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from hvd_magic.timeline.store import SpanStore

__all__ = [
    "CHUNK_BYTES",
    "Timeline",
    "TimelineError",
    "metadata",
    "read",
    "read_fast",
    "read_general",
    "skip_opening",
]

# What the scanner threads hold at a time (a chunk, its columns): each thread's heap keeps about
# that much once the scan is done (glibc does not give a thread heap's top back), so small.
CHUNK_BYTES = 4 * 1024 * 1024

# (file offset, bytes, is the file's last chunk, the file ends with its "]": no event is cut off)
Chunk = tuple[int, memoryview, bool, bool]
MetadataRow = tuple[object, object, Mapping[str, Any] | None]  # an M event's (name, pid, args)


@dataclass
class Timeline:
    """A timeline's spans (compact columns, see ``store``), tensor names by ``pid``, and its
    events as Arrow columns on demand (read again from the file: ``read`` keeps no per-event
    column, so a 3 GB file costs its spans).

    >>> timeline = hvd_magic.timeline.read("timeline.json")      # doctest: +SKIP
    >>> timeline.events.to_pandas().groupby("name").size()
    """

    path: str
    length: int
    tensors: dict[int, str] = field(default_factory=dict)
    start_epoch_us: int | None = None
    truncated: bool = False  # a partial last event was dropped (the writer was cut off)
    closed: bool = True  # the closing "]" is there (killed runs and Horovod < 0.20 lack it)
    tensor_bytes: dict[int, int] = field(default_factory=dict)  # by pid, where Horovod wrote it
    _load: Callable[[], pa.Table] | None = field(default=None, repr=False, compare=False)
    _table: pa.Table | None = field(default=None, repr=False, compare=False)
    _store: SpanStore | None = field(default=None, repr=False, compare=False)

    @property
    def events(self) -> pa.Table:
        """The events as an Arrow table (columns of ``schema.SCHEMA``), built on first use."""
        if self._table is None:
            assert self._load is not None, "a Timeline is made with its table or a way to load it"
            self._table, self._load = self._load(), None
        return self._table

    @property
    def store(self) -> SpanStore:
        """The spans in compact columns, by tensor row then start (what the viewer and the
        analysis read)."""
        if self._store is None:
            from hvd_magic.timeline import _arrow

            self._store = _arrow.span_store(self.events, self.tensors, self.tensor_bytes)
        return self._store

    def spans(self) -> pd.DataFrame:
        """One row per activity, by start: tensor pid, name, start, end, duration (microseconds),
        depth, tensor. Computed once; treat the frame as read-only."""
        return self.store.frame()

    def __len__(self) -> int:
        return self.length

    def to_pandas(self) -> pd.DataFrame:
        frame = self.events.drop_columns(["args"]).to_pandas()
        frame["tensor"] = frame["pid"].map(self.tensors)
        return frame


def read(path: str | Path) -> Timeline:
    """Parse a Horovod Timeline file (complete, truncated, or without its closing ``]``)."""
    name = str(path)
    if Path(path).stat().st_size == 0:
        raise TimelineError(f"{name}: the file is empty (the run may have been killed before writing)")
    timeline = read_fast(name)
    return timeline if timeline is not None else read_general(name)


def _workers() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0))))


def read_fast(name: str) -> Timeline | None:
    """The C scanner's reading, or None when it is not built or the file is not plain Horovod
    output (then :func:`read_general` reads it and says what is wrong)."""
    from hvd_magic.timeline import _fast
    from hvd_magic.timeline.matching import release_memory

    digest = _fast.Digest()
    with open(name, "rb") as file:
        chunks = _Chunks(name, file)
        truncated = _fast.scan(chunks, _workers(), digest)
    if truncated is None:
        return None
    tensors, start = metadata(digest.meta)
    store = digest.builder.finish(digest.names, tensors, digest.tensor_bytes)
    release_memory()  # the scan's buffers, freed
    return Timeline(
        name, digest.events, tensors, start, truncated, chunks.closed, digest.tensor_bytes,
        _load=functools.partial(_events_again, name), _store=store,
    )  # fmt: skip


def _events_again(name: str) -> pa.Table:
    """The events as a table, scanned again (``read`` kept only the spans)."""
    from hvd_magic.timeline import _fast

    with open(name, "rb") as file:
        columns = _fast.columns(_Chunks(name, file), _workers())
    if columns is None:
        raise TimelineError(f"{name}: the file changed since it was read; read it again")
    return columns.table()


def read_general(name: str) -> Timeline:
    """The Arrow reader: any Chrome-trace-like layout, exact error offsets."""
    from hvd_magic.timeline import _arrow

    with open(name, "rb") as file:
        chunks = _Chunks(name, file)
        events, truncated, sizes = _arrow.parse(name, chunks)
    tensors, start = metadata(_arrow.metadata_rows(events))
    return Timeline(name, events.num_rows, tensors, start, truncated, chunks.closed, sizes, _table=events)


def metadata(rows: Iterable[MetadataRow]) -> tuple[dict[int, str], int | None]:
    """Tensor names by pid and the start time, from the ``(name, pid, args)`` of ``M`` events.

    Horovod names each tensor in a ``process_name`` event; the start time since the epoch is in
    the args of one of them.
    """
    tensors: dict[int, str] = {}
    start: int | None = None
    for name, pid, args in rows:
        args = args if isinstance(args, dict) else {}  # (a trace of another tool's: args may be anything)
        tensor = args.get("name")
        if name == "process_name" and isinstance(tensor, str) and isinstance(pid, int):
            tensors[pid] = tensor
        if isinstance(args.get("start_time_since_epoch_in_micros"), int):
            start = int(args["start_time_since_epoch_in_micros"])
    return tensors, start


class _Chunks:
    """The file's events in pieces that end right after an event's ``}`` (before its ``,``).

    Read piece by piece rather than mapped, so memory holds a few chunks, not the file; each
    piece is a view of its own buffer (backends may scan several side by side). The last piece
    comes without the closing ``]``; ``closed`` says whether there was one.
    """

    def __init__(self, path: str, file: io.BufferedReader) -> None:
        self.path, self.file = path, file
        self.closed = False

    def __iter__(self) -> Iterator[Chunk]:
        offset = skip_opening(self.path, self.file)
        carry = b""
        while True:
            buffer = bytearray(len(carry) + CHUNK_BYTES)
            buffer[: len(carry)] = carry
            got = self.file.readinto(memoryview(buffer)[len(carry) :])
            view = memoryview(buffer)[: len(carry) + got]
            if not got:
                view = self._without_bracket(view)
                yield offset, view, True, self.closed
                return
            cut = buffer.rfind(b"},", 0, len(view))
            if cut < 0:
                carry = bytes(view)
                continue
            yield offset, view[: cut + 1], False, False
            offset += cut + 1
            carry = bytes(view[cut + 1 :])

    def _without_bracket(self, view: memoryview) -> memoryview:
        end = len(view)
        while end and view[end - 1] in b" \n\r\t":
            end -= 1
        self.closed = end > 0 and view[end - 1] == ord("]")
        return view[: end - 1] if self.closed else view


def skip_opening(path: str, file: io.BufferedReader) -> int:
    """Reads past the opening ``[``; returns the offset after it."""
    head = file.read(4096)
    start = len(head) - len(head.lstrip())
    if head[start : start + 1] != b"[":
        raise TimelineError(
            f"{path}: byte {start}: a Horovod Timeline starts with '[' (a JSON array of events)"
        )
    file.seek(start + 1)
    return start + 1
