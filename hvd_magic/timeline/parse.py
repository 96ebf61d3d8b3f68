"""A columnar, tolerant reader for Horovod Timeline files (Chrome trace JSON).

Horovod writes one JSON array of events, mostly without newlines (``},{`` between events), and a
killed run leaves it without its closing ``]`` or cut inside an event; releases before 0.20 never
wrote the ``]``. Two readers, both keeping only columns (no Python object per event):

- the fast one (``scan.py``): a small C scanner, one pass over the bytes, chunk by chunk;
- the general one (here), used when the file strays from plain Horovod output (escaped
  strings, fractional numbers) or is damaged: it turns the event separators into newlines in
  place (same length, so byte offsets stay true) and hands chunks to Arrow's JSON reader.

Both drop an incomplete last event; garbage raises ``TimelineError`` naming the file and the
byte offset. Arrow is imported only when a table is asked for.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import HorovodMagicError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Timeline", "TimelineError", "read"]

CHUNK_BYTES = 32 * 1024 * 1024


class TimelineError(HorovodMagicError, ValueError):
    """The file is not a Horovod Timeline (or is damaged beyond its tail)."""


@dataclass
class Timeline:
    """Parsed events as Arrow columns, plus tensor names by ``pid``.

    >>> timeline = hvd_magic.timeline.read("timeline.json")      # doctest: +SKIP
    >>> timeline.events.to_pandas().groupby("name").size()
    """

    path: str
    length: int
    tensors: dict[int, str] = field(default_factory=dict)
    start_epoch_us: int | None = None
    truncated: bool = False  # a partial last event was dropped (the writer was cut off)
    closed: bool = True  # the closing "]" is there (killed runs and Horovod < 0.20 lack it)
    _table: Any = None
    _build: Callable[[], Any] | None = None
    _spans: Any = None  # analysis.spans() result, computed once (viewer and analysis both need it)

    @property
    def events(self) -> pa.Table:
        """The events as an Arrow table (columns of ``schema.SCHEMA``), built on first use."""
        if self._table is None and self._build is not None:
            self._table, self._build = self._build(), None
        return self._table

    def __len__(self) -> int:
        return self.length

    def to_pandas(self) -> object:
        frame = self.events.drop_columns(["args"]).to_pandas()
        frame["tensor"] = frame["pid"].map(self.tensors)
        return frame


def _normalize(raw: bytes) -> bytes:
    # "},{" and "},\n{" become one event per line, keeping every byte offset.
    return raw.replace(b"},{", b"}\n{").replace(b"},\n{", b"}\n {")


def _trim_tail(body: bytes) -> tuple[bytes, bool, bool]:
    """(events, truncated, closed) of the file's last chunk: drops a ``]`` or a cut-off event."""
    stripped = body.rstrip()
    if stripped.endswith(b"]"):
        return stripped[:-1], False, True
    last = max(stripped.rfind(b'{"ph"'), stripped.rfind(b'{"name": "process_'))
    if last < 0:
        return stripped, False, False
    try:
        json.loads(stripped[last:].rstrip(b", \n"))
        return stripped, False, False
    except ValueError:
        return stripped[:last], True, False


def _skip_opening(path: str, file: BinaryIO) -> int:
    """Reads past the opening ``[``; returns the offset after it."""
    head = file.read(4096)
    start = len(head) - len(head.lstrip())
    if head[start : start + 1] != b"[":
        raise TimelineError(
            f"{path}: byte {start}: a Horovod Timeline starts with '[' (a JSON array of events)"
        )
    file.seek(start + 1)
    return start + 1


def _chunks(file: BinaryIO, offset: int, size: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, bytes, is_last) pieces that end between events (right after a ``}`` before ``,``).

    Read piece by piece rather than mapped, so memory holds one chunk, not the file.
    """
    carry = b""
    while True:
        block = file.read(size)
        data = carry + block
        if not block:
            yield offset, data, True
            return
        cut = data.rfind(b"},")
        if cut < 0:
            carry = data
            continue
        yield offset, data[: cut + 1], False
        offset += cut + 1
        carry = data[cut + 1 :]


def _parse_chunk(path: str, offset: int, raw: bytes, last: bool) -> tuple[pa.Table, bool, bool]:
    from .schema import SCHEMA

    body = raw.lstrip(b", \n\r\t")
    skipped = len(raw) - len(body)
    truncated, closed = False, True
    if last:
        body, truncated, closed = _trim_tail(body)
    body = body.rstrip().rstrip(b",")
    if not body.strip():
        return SCHEMA.empty_table(), truncated, closed
    return _parse_general(path, offset + skipped, _normalize(body)), truncated, closed


def _parse_general(path: str, offset: int, body: bytes) -> pa.Table:
    import pyarrow as pa
    import pyarrow.json as pj

    from .schema import SCHEMA

    options = pj.ParseOptions(explicit_schema=SCHEMA, unexpected_field_behavior="ignore")
    try:
        return pj.read_json(io.BytesIO(body), parse_options=options)
    except pa.ArrowInvalid as err:
        raise TimelineError(f"{path}: not a Horovod Timeline: {_locate(body, str(err), offset)}") from None


def _locate(body: bytes, message: str, offset: int) -> str:
    """The byte offset of the first event that is not valid JSON (only on the error path)."""
    position = 0
    while position < len(body):
        end = body.find(b"\n", position)
        end = len(body) if end < 0 else end
        line = body[position:end].strip()
        if line:
            try:
                json.loads(line)
            except ValueError:
                return f"byte {offset + position}: {line[:60]!r} is not a JSON event"
        position = end + 1
    return f"bytes {offset}..{offset + len(body)}: {message.splitlines()[0]}"


def read(path: str | Path) -> Timeline:
    """Parse a Horovod Timeline file (complete, truncated, or without its closing ``]``)."""
    name = str(path)
    if Path(path).stat().st_size == 0:
        raise TimelineError(f"{name}: the file is empty (the run may have been killed before writing)")
    from .scan import read_fast

    timeline = read_fast(name)
    return timeline if timeline is not None else read_general(name)


def read_general(name: str) -> Timeline:
    """The Arrow-based reader: any Chrome-trace-like layout, exact error offsets."""
    import pyarrow as pa

    from .schema import SCHEMA

    pieces, truncated, closed = [], False, False
    with open(name, "rb") as file:
        for offset, raw, last in _chunks(file, _skip_opening(name, file)):
            table, cut, closed = _parse_chunk(name, offset, raw, last=last)
            truncated |= cut
            pieces.append(_compact(table))
    events = pa.concat_tables(pieces) if pieces else SCHEMA.empty_table()
    tensors, start = _metadata(events)
    return Timeline(name, events.num_rows, tensors, start, truncated, closed, _table=events)


def _compact(table: pa.Table) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc

    # Activity names repeat millions of times: dictionary-encode them chunk by chunk.
    for column in ("ph", "name"):
        index = table.schema.get_field_index(column)
        table = table.set_column(
            index, column, pc.dictionary_encode(table[column]).cast(pa.dictionary(pa.int32(), pa.string()))
        )
    return table


def _metadata(events: pa.Table) -> tuple[dict[int, str], int | None]:
    import pyarrow as pa
    import pyarrow.compute as pc

    meta = events.filter(pc.equal(events["ph"].cast(pa.string()), "M"))
    tensors, start = {}, None
    for row in meta.select(["name", "pid", "args"]).to_pylist():
        args = row["args"] or {}
        if row["name"] == "process_name" and args.get("name") is not None and row["pid"] is not None:
            tensors[int(row["pid"])] = args["name"]
        if args.get("start_time_since_epoch_in_micros") is not None:
            start = int(args["start_time_since_epoch_in_micros"])
    return tensors, start
