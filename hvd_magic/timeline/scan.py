"""The fast reader: the C scanner (``_scan.c``) over the file chunk by chunk, into numpy columns.

Returns None, so that the general reader takes over, when the scanner is not built or the file
strays from plain Horovod output (escaped strings, fractional numbers, garbage).
"""

from __future__ import annotations

import collections
import io
import json
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .parse import Timeline, _skip_opening

CHUNK_BYTES = 16 * 1024 * 1024

__all__ = ["read_fast"]

ABSENT = np.iinfo(np.int64).min


def read_fast(name: str) -> Timeline | None:
    try:
        from . import _scan
    except ImportError:
        return None
    workers = max(1, min(4, len(os.sched_getaffinity(0))))
    parts: list[tuple[Any, ...]] = []
    truncated = closed = False
    with open(name, "rb") as file, ThreadPoolExecutor(workers) as pool:
        pending: collections.deque[tuple[memoryview, bool, Future[Any]]] = collections.deque()
        # The scanner releases the GIL: chunks are scanned side by side, a few in flight at most.
        _skip_opening(name, file)
        for raw, last in _views(file):
            pending.append((raw, last, pool.submit(_scan.scan, raw, last)))
            while len(pending) > workers or (last and pending):
                raw_done, was_last, future = pending.popleft()
                part = future.result()
                consumed, error_at = part[0], part[1]
                if error_at >= 0 or (consumed < len(raw_done) and not was_last):
                    return None  # not plain Horovod output: the general reader says where
                if was_last:
                    tail = bytes(raw_done[consumed:])
                    truncated = bool(tail.strip(b" \n\r\t,]"))
                    closed = bytes(raw_done[-64:]).rstrip().endswith(b"]")
                parts.append(part[2:])
    return _assemble(name, parts, truncated, closed)


def _views(file: io.BufferedReader) -> Iterator[tuple[memoryview, bool]]:
    """Chunks that end right after an event's ``}``, as views (no copy of the file's bytes)."""
    carry = b""
    while True:
        buffer = bytearray(len(carry) + CHUNK_BYTES)
        buffer[: len(carry)] = carry
        got = file.readinto(memoryview(buffer)[len(carry) :])
        size = len(carry) + got
        view = memoryview(buffer)[:size]
        if not got:
            yield view, True
            return
        cut = buffer.rfind(b"},", 0, size)
        if cut < 0:
            carry = bytes(view)
            continue
        yield view[: cut + 1], False
        carry = bytes(view[cut + 1 :])


def _assemble(name: str, parts: list[tuple[Any, ...]], truncated: bool, closed: bool) -> Timeline:
    vocabulary: dict[str, int] = {}
    columns: dict[str, list[np.ndarray]] = {"ph": [], "name": [], "ts": [], "pid": [], "dur": []}
    tensors: dict[int, str] = {}
    start: int | None = None
    for ph, ids, ts, pid, dur, names, meta in parts:
        local = np.array([vocabulary.setdefault(n, len(vocabulary)) for n in names] + [-1], dtype=np.int32)
        columns["ph"].append(np.frombuffer(ph, np.uint8))
        columns["name"].append(local[np.frombuffer(ids, np.int32)])  # id -1 picks the trailing -1
        for key, raw in (("ts", ts), ("pid", pid), ("dur", dur)):
            columns[key].append(np.frombuffer(raw, np.int64))
        pids = columns["pid"][-1]
        for index, args in meta:
            start, tensor = _metadata(json.loads(args), start)
            if tensor is not None:
                tensors[int(pids[index])] = tensor
    merged = {key: np.concatenate(chunks) if chunks else np.empty(0) for key, chunks in columns.items()}
    names_by_id = sorted(vocabulary, key=vocabulary.__getitem__)
    return Timeline(
        name,
        len(merged["ph"]),
        tensors,
        start,
        truncated=truncated,
        closed=closed,
        _build=lambda: _table(merged, names_by_id, tensors, start),
    )


def _metadata(args: dict[str, Any], start: int | None) -> tuple[int | None, str | None]:
    if "start_time_since_epoch_in_micros" in args:
        start = int(args["start_time_since_epoch_in_micros"])
    tensor = args.get("name")
    return start, tensor if isinstance(tensor, str) else None


def _table(
    columns: dict[str, np.ndarray], names: list[str], tensors: dict[int, str], start: int | None
) -> Any:
    """The Arrow table of ``schema.SCHEMA`` over the numpy columns (integers without copies)."""
    import pyarrow as pa

    from .schema import SCHEMA

    ph = columns["ph"]
    codes, index = np.unique(ph, return_inverse=True)
    name_ids = columns["name"]
    is_meta = ph == ord("M")
    args_name = np.full(len(ph), None, dtype=object)
    args_start = np.full(len(ph), None, dtype=object)
    meta_rows = np.flatnonzero(is_meta)
    for row in meta_rows:
        pid = int(columns["pid"][row])
        if names[name_ids[row]] == "process_name" and pid in tensors:
            args_name[row] = tensors[pid]
    if start is not None and len(meta_rows):
        args_start[meta_rows[0]] = start
    args = pa.StructArray.from_arrays(
        [pa.array(args_name, pa.string()), pa.array(args_start, pa.int64())],
        fields=list(SCHEMA.field("args").type),
        mask=pa.array(~is_meta),
    )
    return pa.table(
        {
            "ph": pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int32)), [chr(c) for c in codes]),
            "name": pa.DictionaryArray.from_arrays(
                pa.array(np.maximum(name_ids, 0), mask=name_ids < 0), pa.array(names, pa.string())
            ),
            **{key: pa.array(columns[key], mask=columns[key] == ABSENT) for key in ("ts", "dur", "pid")},
            "args": args,
        }
    ).select(SCHEMA.names)
