"""Shard files: the Arrow IPC file a rank's rows wait in, on the machine where the rank runs.

Written batch by batch as the rows arrive (a Spark task never holds a whole partition), read by
the rank through a memory map: ``arrow`` and ``batches`` cost no copy, so a shard larger than
the rank's memory streams from the page cache.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from hvd_magic.data.parquet import MANIFEST, no_index, read_manifest, read_pieces, read_table

__all__ = ["read_shard", "scratch_dir", "write_shard"]

FORMS = ("pandas", "arrow", "batches")
SCRATCH_VARIABLES = (("LOCAL_DIRS", ","), ("SPARK_EXECUTOR_DIRS", os.pathsep), ("SPARK_LOCAL_DIRS", ","))


def scratch_dir() -> str:
    """Where this executor keeps its scratch files, as Spark chooses it for its own shuffle
    files: YARN's LOCAL_DIRS, the standalone worker's SPARK_EXECUTOR_DIRS, SPARK_LOCAL_DIRS
    (Kubernetes, spark-env.sh); else the system's temporary folder. On a cluster these are the
    large local disks (/tmp may be a small disk or memory)."""
    for name, separator in SCRATCH_VARIABLES:
        for folder in os.environ.get(name, "").split(separator):
            if folder and os.path.isdir(folder) and os.access(folder, os.W_OK):
                return folder
    return tempfile.gettempdir()


def write_shard(
    path: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema, metadata: dict[str, str]
) -> int:
    """Write ``batches`` to ``path`` (written under a temporary name, then renamed, so a reader
    never sees half a file); returns the number of rows."""
    rows = 0
    partial = f"{path}.partial"
    ours = {f"hvd_magic.{key}".encode(): value.encode() for key, value in metadata.items()}
    # pandas' dtypes kept (alike on every rank), its index a column
    schema = schema.with_metadata({**no_index(schema.metadata or {}), **ours})
    with pa.OSFile(partial, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for batch in batches:
            if batch.num_rows:
                writer.write_batch(batch)
                rows += batch.num_rows
    os.replace(partial, path)
    return rows


def read_shard(path: str, form: str = "pandas") -> Any:
    """The shard at ``path`` as a pandas DataFrame, a pyarrow Table, or an iterator of record
    batches (``form``: pandas, arrow, batches). A Parquet manifest (``data.parquet``) is read
    from the files it names, a row group at a time."""
    if form not in FORMS:
        raise ValueError(f"shard form must be one of {', '.join(FORMS)}; got {form!r}")
    if path.endswith(MANIFEST):
        schema, pieces = read_manifest(path)
        if form == "batches":
            return read_pieces(pieces)
        table = read_table(pieces).replace_schema_metadata(schema.metadata)
        return table if form == "arrow" else table.to_pandas()
    reader = pa.ipc.open_file(pa.memory_map(path, "r"))
    if form == "batches":
        return _batches(reader)
    table = reader.read_all()
    return table if form == "arrow" else table.to_pandas()


def _batches(reader: pa.ipc.RecordBatchFileReader) -> Iterator[pa.RecordBatch]:
    for index in range(reader.num_record_batches):
        yield reader.get_batch(index)
