"""A columnar, tolerant reader for Horovod Timeline files (Chrome trace JSON).

Horovod writes one JSON array of events, mostly without newlines (``},{`` between events), and a
killed run leaves it without its closing ``]`` or cut inside an event; releases before 0.20 never
wrote the ``]``. The reader turns the event separators into newlines in place (same length, so
byte offsets stay true), hands fixed-size chunks to Arrow's multi-threaded JSON reader with an
explicit schema, drops an incomplete last event, and keeps only columns (no Python object per
event). Garbage raises ``TimelineError`` naming the file and the byte offset.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ..errors import HorovodMagicError

__all__ = ["SCHEMA", "Timeline", "TimelineError", "read"]

CHUNK_BYTES = 32 * 1024 * 1024

SCHEMA = pa.schema(
    [
        ("ph", pa.string()),
        ("name", pa.string()),
        ("ts", pa.int64()),
        ("dur", pa.int64()),
        ("pid", pa.int64()),
        ("args", pa.struct([("name", pa.string()), ("start_time_since_epoch_in_micros", pa.int64())])),
    ]
)
_OPTIONS = pj.ParseOptions(explicit_schema=SCHEMA, unexpected_field_behavior="ignore")


class TimelineError(HorovodMagicError, ValueError):
    """The file is not a Horovod Timeline (or is damaged beyond its tail)."""


@dataclass
class Timeline:
    """Parsed events as Arrow columns, plus tensor names by ``pid``.

    >>> timeline = hvd_magic.timeline.read("timeline.json")      # doctest: +SKIP
    >>> timeline.events.to_pandas().groupby("name").size()
    """

    path: str
    events: pa.Table
    tensors: dict[int, str] = field(default_factory=dict)
    start_epoch_us: int | None = None
    truncated: bool = False  # a partial last event was dropped (the writer was cut off)
    closed: bool = True  # the closing "]" is there (killed runs and Horovod < 0.20 lack it)

    def __len__(self) -> int:
        return int(self.events.num_rows)

    def to_pandas(self) -> object:
        frame = self.events.drop_columns(["args"]).to_pandas()
        frame["tensor"] = frame["pid"].map(self.tensors)
        return frame


def _normalize(raw: bytes) -> bytes:
    # "},{" and "},\n{" become one event per line, keeping every byte offset.
    return raw.replace(b"},{", b"}\n{").replace(b"},\n{", b"}\n {")


def _last_complete(body: bytes) -> int:
    """Length of ``body`` up to its last complete event line (a truncated tail is dropped)."""
    end = len(body.rstrip())
    while end > 0:
        start = body.rfind(b"\n", 0, end) + 1
        line = body[start:end].strip().rstrip(b",]").strip()
        if not line:
            end = start - 1
            continue
        try:
            json.loads(line)
            return end
        except ValueError:
            return start
    return 0


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


def _chunks(file: BinaryIO, offset: int) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, bytes, is_last) pieces that end between events (right after a ``}`` before ``,``).

    Read piece by piece rather than mapped, so memory holds one chunk, not the file.
    """
    carry = b""
    while True:
        block = file.read(CHUNK_BYTES)
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
    body = _normalize(raw).lstrip(b", \n\r\t")
    skipped = len(raw) - len(_normalize(raw).lstrip(b", \n\r\t"))
    truncated, closed = False, True
    stripped = body.rstrip()
    if last:
        if stripped.endswith(b"]"):
            body = stripped[:-1]
        else:
            closed = False
            keep = _last_complete(body)
            truncated = keep < len(stripped)
            body = body[:keep]
    body = body.rstrip().rstrip(b",")
    if not body.strip():
        return SCHEMA.empty_table(), truncated, closed
    try:
        table = pj.read_json(io.BytesIO(body), parse_options=_OPTIONS)
    except pa.ArrowInvalid as err:
        raise TimelineError(
            f"{path}: not a Horovod Timeline near {_locate(body, str(err), offset + skipped)}"
        ) from None
    return table, truncated, closed


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
    pieces, truncated, closed = [], False, False
    with open(path, "rb") as file:
        for offset, raw, last in _chunks(file, _skip_opening(name, file)):
            table, cut, closed = _parse_chunk(name, offset, raw, last=last)
            truncated |= cut
            pieces.append(_compact(table))
    events = pa.concat_tables(pieces) if pieces else SCHEMA.empty_table()
    return Timeline(name, events, *_metadata(events), truncated=truncated, closed=closed)


def _compact(table: pa.Table) -> pa.Table:
    # Activity names repeat millions of times: dictionary-encode them chunk by chunk.
    for column in ("ph", "name"):
        index = table.schema.get_field_index(column)
        table = table.set_column(
            index, column, pc.dictionary_encode(table[column]).cast(pa.dictionary(pa.int32(), pa.string()))
        )
    return table


def _metadata(events: pa.Table) -> tuple[dict[int, str], int | None]:
    meta = events.filter(pc.equal(events["ph"].cast(pa.string()), "M"))
    tensors, start = {}, None
    for row in meta.select(["name", "pid", "args"]).to_pylist():
        args = row["args"] or {}
        if row["name"] == "process_name" and args.get("name") is not None and row["pid"] is not None:
            tensors[int(row["pid"])] = args["name"]
        if args.get("start_time_since_epoch_in_micros") is not None:
            start = int(args["start_time_since_epoch_in_micros"])
    return tensors, start
