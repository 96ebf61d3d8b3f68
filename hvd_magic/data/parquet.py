"""``data=`` a plain Parquet scan: shards read straight from the files, not through Spark's rows.

When the DataFrame is exactly ``spark.read.parquet(path)``, or a choice of its columns (its
analyzed plan is one Parquet relation without partition columns, under at most a projection of
plain attributes; on Spark Connect, ``sameSemantics`` with a fresh read says so) and pyarrow can
open its files from the notebook, the files' footers give every row group's
row count, so the split is planned without a Spark job. Each barrier task then hands its rank a
manifest of row ranges (a small JSON file where the Arrow shard would be), and the rank reads
them with pyarrow: the rows never become Spark rows, and there is no shuffle. Shards are
contiguous runs of rows in file order here (as Petastorm gives each rank whole row groups):
shuffle within the shard. Anything else (a filter, a new column, partition directories, files
pyarrow cannot open from the notebook) takes the general path in ``source``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hvd_magic.data.split import ShardPlan, plan_shards

__all__ = [
    "MANIFEST",
    "Piece",
    "no_index",
    "parquet_plan",
    "pieces_of",
    "read_manifest",
    "read_pieces",
    "read_table",
    "vector_columns",
    "write_manifest",
]

MANIFEST = ".pieces.json"  # how a shard file that lists Parquet row ranges ends


@dataclass(frozen=True)
class Piece:
    """Rows ``start`` to ``stop`` (exclusive) of row group ``group`` of the file at ``uri``;
    ``columns`` of them (None: all)."""

    uri: str
    group: int
    start: int
    stop: int
    columns: tuple[str, ...] | None = None


def parquet_plan(df: Any, name: str, np: int, keep: bool) -> tuple[list[list[Piece]], ShardPlan] | None:
    """Each shard's pieces and the split, if ``df`` is a plain Parquet scan (or a choice of its
    columns) pyarrow can read."""
    files = _plain_scan_files(df)
    if not files:
        return None
    try:
        footers = {uri: _footer(uri) for uri in files}
    except (OSError, ValueError, ImportError):
        return None  # not for pyarrow from here (an object store without credentials...)
    groups = [(uri, group, rows) for uri, (counts, _) in footers.items() for group, rows in enumerate(counts)]
    columns = footers[files[0]][1]
    if any(names != columns for _, names in footers.values()):
        return None  # files with other columns: Spark merges their schemas, pyarrow would not
    wanted = list(df.columns)
    if not set(wanted) <= set(columns) or len(set(wanted)) < len(wanted):
        return None  # partition columns live in directory names, not in the files
    plan = plan_shards(sum(rows for _, _, rows in groups), np, keep, name)
    return pieces_of(groups, plan.sizes(), None if wanted == columns else tuple(wanted)), plan


def vector_columns(df: Any) -> list[str]:
    """The Spark ML vector columns of ``df`` (e.g. from a VectorAssembler): pyarrow cannot read
    them as Spark wrote them, so they take Spark's path, converted to arrays."""
    return [f.name for f in df.schema.fields if type(f.dataType).__name__ == "VectorUDT"]


def _plain_scan_files(df: Any) -> list[str]:
    if vector_columns(df):
        return []
    try:
        files = sorted(df.inputFiles())
        if files and all(f.endswith(".parquet") for f in files) and _plain_scan(df, files):
            return files
    except Exception:  # noqa: BLE001 - a DataFrame Spark cannot describe this way takes the general path
        pass
    return []


def _plain_scan(df: Any, files: list[str]) -> bool:
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:  # classic: read the analyzed plan (a few py4j calls)
        plan = jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() == "Project":  # a choice of columns, nothing computed
            chosen = plan.projectList()
            named = (chosen.apply(i).getClass().getSimpleName() for i in range(chosen.size()))
            if any(kind != "AttributeReference" for kind in named):
                return False
            plan = plan.child()
        if plan.getClass().getSimpleName() != "LogicalRelation":
            return False
        relation = plan.relation()
        return bool(
            relation.getClass().getSimpleName() == "HadoopFsRelation"
            and relation.fileFormat().getClass().getSimpleName() == "ParquetFileFormat"
            and relation.partitionSchema().isEmpty()
        )
    # Spark Connect: no plan to read, but the server compares plans.
    root = os.path.commonpath([f.split("://", 1)[-1] for f in files])
    scheme = files[0].split("://", 1)[0] + "://" if "://" in files[0] else ""
    reads = (df.sparkSession.read.parquet(path) for path in (scheme + root, root))
    return any(read.select(*df.columns).sameSemantics(df) or read.sameSemantics(df) for read in reads)


def _open(uri: str) -> Any:
    """The file at ``uri``; a local one memory-mapped (no copy out of the page cache)."""
    import pyarrow as pa
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(uri)
    if isinstance(filesystem, fs.LocalFileSystem):
        return pa.memory_map(path, "r")
    return filesystem.open_input_file(path)


def _footer(uri: str) -> tuple[list[int], list[str]]:
    """The rows of each row group of the file at ``uri``, and its columns."""
    import pyarrow.parquet as pq

    with _open(uri) as source:
        parquet = pq.ParquetFile(source)
        metadata = parquet.metadata
        rows = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
        return rows, list(parquet.schema_arrow.names)


def pieces_of(
    groups: list[tuple[str, int, int]], sizes: list[int], columns: tuple[str, ...] | None = None
) -> list[list[Piece]]:
    """Row groups (file, group, rows) in order, cut into consecutive runs of ``sizes`` rows
    (pure); the rows after the last shard are left out (the dropped remainder)."""
    shards: list[list[Piece]] = [[] for _ in sizes]
    shard, need = 0, sizes[0]
    for uri, group, rows in groups:
        start = 0
        while start < rows and shard < len(sizes):
            take = min(need, rows - start)
            shards[shard].append(Piece(uri, group, start, start + take, columns))
            start, need = start + take, need - take
            if need == 0:
                shard += 1
                need = sizes[shard] if shard < len(sizes) else 0
    return shards


def read_pieces(pieces: list[Piece]) -> Iterator[Any]:
    """The rows of ``pieces`` as Arrow record batches, one row group at a time (for shards
    larger than memory)."""
    import pyarrow.parquet as pq

    for uri, group in _by_file(pieces).items():
        with _open(uri) as source:
            parquet = pq.ParquetFile(source)
            for piece in group:
                table = parquet.read_row_group(piece.group, columns=piece.columns)
                table = table.slice(piece.start, piece.stop - piece.start)
                yield from table.to_batches()


def read_table(pieces: list[Piece]) -> Any:
    """The rows of ``pieces`` as one Arrow table: each file's row groups in one threaded read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = []
    for uri, group in _by_file(pieces).items():
        with _open(uri) as source:
            parquet = pq.ParquetFile(source)
            groups = list(dict.fromkeys(piece.group for piece in group))
            table = parquet.read_row_groups(groups, columns=group[0].columns)
            first, running = {}, 0
            for index in groups:
                first[index], running = running, running + parquet.metadata.row_group(index).num_rows
            parts += [table.slice(first[p.group] + p.start, p.stop - p.start) for p in group]
    return pa.concat_tables(parts)


def _by_file(pieces: list[Piece]) -> dict[str, list[Piece]]:
    files: dict[str, list[Piece]] = {}
    for piece in pieces:
        files.setdefault(piece.uri, []).append(piece)
    return files


def write_manifest(path: str, pieces: list[Piece], metadata: dict[str, str]) -> str:
    """A shard as the Parquet row ranges its rank reads (and, as for an Arrow shard file, who
    wrote it: ``metadata``); returns the manifest's path."""
    manifest = path + MANIFEST
    with open(manifest, "w", encoding="utf-8") as out:
        json.dump({"metadata": metadata, "pieces": [dataclasses.asdict(piece) for piece in pieces]}, out)
    return manifest


def read_manifest(path: str) -> tuple[Any, list[Piece]]:
    """The schema (with the writer's metadata) and the pieces of a manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(path, encoding="utf-8") as manifest:
        content = json.load(manifest)
    items = content["pieces"]
    pieces = [
        Piece(**item | {"columns": tuple(item["columns"]) if item.get("columns") else None}) for item in items
    ]
    with _open(pieces[0].uri) as source:
        schema = pq.ParquetFile(source).schema_arrow
    if pieces[0].columns is not None:
        schema = pa.schema([schema.field(name) for name in pieces[0].columns], schema.metadata)
    ours = {f"hvd_magic.{key}".encode(): value.encode() for key, value in content["metadata"].items()}
    return schema.with_metadata({**no_index(schema.metadata or {}), **ours}), pieces


def no_index(metadata: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """Pandas' metadata of a table (``df.to_parquet()``, ``Table.from_pandas``) with its index a
    column, as Spark reads it: every path's shard keeps the dtypes and has the index a column."""
    if b"pandas" not in metadata:
        return metadata
    described = json.loads(metadata[b"pandas"])
    return metadata | {b"pandas": json.dumps(described | {"index_columns": []}).encode()}
