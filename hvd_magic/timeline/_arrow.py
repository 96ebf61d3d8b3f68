"""The general backend: Arrow's JSON reader over the reader's chunks.

Used when a file strays from plain Horovod output (escaped strings, fractional numbers) or is
damaged. Each chunk's event separators become newlines in place (same length, so byte offsets
stay true) and Arrow reads the lines; on garbage, the byte offset of the first event that is not
JSON goes into the ``TimelineError``.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from hvd_magic.errors import TimelineError
from hvd_magic.timeline.matching import ABSENT
from hvd_magic.timeline.schema import SCHEMA
from hvd_magic.timeline.store import SpanStore, StoreBuilder, keep_largest

__all__ = ["metadata_rows", "parse", "span_store", "tensor_bytes"]


TENSOR = [("dtype", pa.string()), ("shape", pa.string())]
# What is parsed: SCHEMA, and the dtype and shape Horovod writes where an operation on a tensor
# ends (turned into the tensor's bytes, then dropped from the events); times as numbers, a
# fraction of a microsecond too (other tools' Chrome traces), rounded to SCHEMA's int64 after
TIMES = ("ts", "dur")
PARSED = pa.schema(
    [
        *(
            pa.field(field.name, pa.float64()) if field.name in TIMES else field
            for field in SCHEMA
            if field.name != "args"
        ),
        pa.field("args", pa.struct([*SCHEMA.field("args").type, *TENSOR])),
    ]
)
SHAPE = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]")


def parse(
    path: str, chunks: Iterable[tuple[int, memoryview, bool, bool]]
) -> tuple[pa.Table, bool, dict[int, int]]:
    """(events, truncated, tensor bytes by pid): every complete event of the chunks; truncated
    when the file has no closing ``]`` and its last chunk ends inside an event (that event is
    dropped)."""
    pieces, truncated, sizes = [], False, dict[int, int]()
    for offset, view, last, closed in chunks:
        table, cut = _parse_chunk(path, offset, bytes(view), last and not closed)
        truncated |= cut
        for name in TIMES:
            try:
                column = pc.round(table[name]).cast(pa.int64())
            except pa.ArrowInvalid:
                raise TimelineError(
                    f"{path}: not a Horovod Timeline: a {name} past 2**63 microseconds"
                ) from None
            table = table.set_column(table.schema.get_field_index(name), name, column)
        keep_largest(sizes, *_sizes(table))
        table = table.set_column(
            table.schema.get_field_index("args"), "args", table["args"].cast(SCHEMA.field("args").type)
        )
        pieces.append(_compact(table))
    return (pa.concat_tables(pieces) if pieces else SCHEMA.empty_table()), truncated, sizes


def tensor_bytes(dtype: str, shape: str) -> int | None:
    """The bytes of a tensor Horovod describes as e.g. ``float32`` and ``[3, 10]``."""
    width = 1 if dtype.lower().endswith("bool") else None
    if width is None and (bits := re.search(r"(\d{1,3})$", dtype)) and int(bits[1]) % 8 == 0:
        width = int(bits[1]) // 8
    dims = SHAPE.fullmatch(shape)
    if not width or dims is None:
        return None
    return width * math.prod(int(d) for d in (dims[1] or "").split(",") if d.strip())


def _sizes(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(pids, bytes) of the events that end an operation on a tensor and give its size."""
    ends = table.filter(
        pc.and_(pc.equal(table["ph"], "E"), pc.is_valid(pc.struct_field(table["args"], "dtype")))
    )
    pids, sizes = [], []
    for pid, given in zip(ends["pid"].to_pylist(), ends["args"].to_pylist(), strict=True):
        size = tensor_bytes(given["dtype"], given.get("shape") or "")
        if isinstance(pid, int) and size is not None:
            pids.append(pid)
            sizes.append(size)
    return np.array(pids, np.int64), np.array(sizes, np.int64)


def metadata_rows(events: pa.Table) -> list[tuple[str | None, int | None, dict[str, Any] | None]]:
    """(name, pid, args) of each ``M`` event."""
    meta = events.filter(pc.equal(events["ph"].cast(pa.string()), "M"))
    return [
        (row["name"], row["pid"], row["args"]) for row in meta.select(["name", "pid", "args"]).to_pylist()
    ]


def span_store(events: pa.Table, tensors: Mapping[int, str], sizes: Mapping[int, int]) -> SpanStore:
    """The spans of a table's events (a general-backend read, or any ``Timeline`` built from one)."""
    names = _encoded(events["name"])
    phases = _encoded(events["ph"])
    first = [ord(p[0]) if p and ord(p[0]) < 128 else 32 for p in phases.dictionary.to_pylist()]
    codes = np.array([*first, 32], np.uint8)[_ids(phases)]  # no phase (-1): the trailing blank
    vocabulary = names.dictionary.to_pylist()
    ts, pid = (pc.fill_null(events[c], ABSENT).to_numpy().astype(np.int64) for c in ("ts", "pid"))
    builder = StoreBuilder()
    builder.add(
        codes, _ids(names), ts, pid, vocabulary.index("CYCLE_START") if "CYCLE_START" in vocabulary else None
    )
    return builder.finish(vocabulary, tensors, sizes)


def _encoded(column: pa.ChunkedArray) -> pa.DictionaryArray:
    """One dictionary for the whole column (each chunk came with its own)."""
    return pc.dictionary_encode(column.cast(pa.string()).combine_chunks())


def _ids(encoded: pa.DictionaryArray) -> np.ndarray:
    ids: np.ndarray = pc.fill_null(encoded.indices, -1).to_numpy().astype(np.int32)
    return ids


def _parse_chunk(path: str, offset: int, raw: bytes, may_be_cut: bool) -> tuple[pa.Table, bool]:
    body = raw.lstrip(b", \n\r\t")
    skipped = len(raw) - len(body)
    truncated = False
    if may_be_cut:
        body, truncated = _drop_cut_event(body)
    body = body.rstrip().rstrip(b",")
    if not body.strip():
        return PARSED.empty_table(), truncated
    return _parse_events(path, offset + skipped, _normalize(body)), truncated


def _drop_cut_event(body: bytes) -> tuple[bytes, bool]:
    """(events, truncated) of the file's last chunk: drops an event the writer did not finish."""
    stripped = body.rstrip()
    last = max(stripped.rfind(b'{"ph"'), stripped.rfind(b'{"name": "process_'))
    if last < 0:
        return stripped, False
    try:
        json.loads(stripped[last:].rstrip(b", \n"))
        return stripped, False
    except ValueError:
        return stripped[:last], True


def _normalize(raw: bytes) -> bytes:
    # "},{", "}, {" (json.dumps) and "},\n{" become one event per line, keeping every byte offset.
    return raw.replace(b"},{", b"}\n{").replace(b"}, {", b"}\n {").replace(b"},\n{", b"}\n {")


def _parse_events(path: str, offset: int, body: bytes) -> pa.Table:
    options = pj.ParseOptions(explicit_schema=PARSED, unexpected_field_behavior="ignore")
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
                at = body.find(line, position)  # past the line's indent (events may be on lines of their own)
                return f"byte {offset + at}: {line[:60]!r} is not a JSON event"
        position = end + 1
    return f"bytes {offset}..{offset + len(body)}: {message.splitlines()[0]}"


def _compact(table: pa.Table) -> pa.Table:
    # Activity names repeat millions of times: dictionary-encode them chunk by chunk.
    for column in ("ph", "name"):
        index = table.schema.get_field_index(column)
        table = table.set_column(
            index, column, pc.dictionary_encode(table[column]).cast(pa.dictionary(pa.int32(), pa.string()))
        )
    return table
