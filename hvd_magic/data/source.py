"""Notebook side of ``data=``: what it accepts, and how its rows become shards.

Locally (np < 0) the notebook writes one Arrow file per rank. On Spark the rows stay on the
executors: one cheap job counts the rows of each partition (only the partition ids are read),
then each row gets the key of its shard and a hash repartition on that key puts shard ``i``
exactly in partition ``i`` of the barrier stage. The keys are chosen by asking Spark which
small integers its own hash sends to which partition, so this works on classic and Spark
Connect sessions alike, with the DataFrame API only.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from hvd_magic.data.parquet import Piece, parquet_plan, vector_columns
from hvd_magic.data.split import ShardPlan, partition_offsets, plan_shards
from hvd_magic.errors import DataError

__all__ = [
    "KEY",
    "SparkStage",
    "check_source",
    "local_shards",
    "spark_dataframe",
    "spark_shards",
    "spark_stage",
]

KEY = "__hvd_magic_shard"  # the shard key column; the barrier task drops it before writing
INDEX = "__hvd_magic_row"  # the row's number (for the keys only)
_KEY_CANDIDATES = 64  # per shard: Spark's hash spreads these over every partition


def _is_spark(value: Any) -> bool:
    sql = sys.modules.get("pyspark.sql")
    return sql is not None and isinstance(value, sql.DataFrame)


def _is_pandas(value: Any) -> bool:
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame)


def _is_arrow(value: Any) -> bool:
    arrow = sys.modules.get("pyarrow")
    return arrow is not None and isinstance(value, arrow.Table)


def check_source(value: Any, name: str) -> None:
    """A DataError unless ``value`` is a Spark DataFrame (classic or Connect), a pandas
    DataFrame or a pyarrow Table."""
    if not (_is_spark(value) or _is_pandas(value) or _is_arrow(value)):
        raise DataError(
            f"data={name} is a {type(value).__module__}.{type(value).__qualname__}; data= takes a Spark "
            "DataFrame (classic or Spark Connect), a pandas DataFrame or a pyarrow Table."
        )


def _vectors_as_arrays(df: Any) -> Any:
    """Spark ML vector columns as arrays of doubles."""
    vectors = vector_columns(df)
    if vectors:
        from pyspark.ml.functions import vector_to_array

        for column in vectors:
            df = df.withColumn(column, vector_to_array(df[column]))
    return df


def _to_arrow(value: Any) -> Any:
    import pyarrow as pa

    if _is_spark(value):
        return _vectors_as_arrays(value).toArrow()
    if _is_pandas(value):
        return pa.Table.from_pandas(value, preserve_index=False)
    return value


def local_shards(value: Any, name: str, np: int, keep: bool, directory: str) -> tuple[list[str], str]:
    """Write one shard file per rank into ``directory``; returns their paths and the notice."""
    from hvd_magic.data.files import write_shard

    table = _to_arrow(value)
    plan = plan_shards(table.num_rows, np, keep, name)
    shard = plan.shard_of(0, table.num_rows)
    paths = []
    for rank in range(np):
        path = os.path.join(directory, f"shard-{rank}.arrow")
        rows = table.filter(shard == rank).combine_chunks()
        write_shard(path, rows.to_batches(), table.schema, {"rank": str(rank), "pid": str(os.getpid())})
        paths.append(path)
    return paths, plan.notice(name)


def spark_dataframe(value: Any, session: Any) -> Any:
    """``value`` as a DataFrame of ``session`` (pandas and Arrow input is uploaded)."""
    return value if _is_spark(value) else session.createDataFrame(value)


def spark_shards(df: Any, name: str, np: int, keep: bool) -> tuple[Any, ShardPlan]:
    """A DataFrame whose partition ``i`` holds exactly shard ``i`` (with the ``KEY`` column),
    and the split, for a barrier stage of ``np`` tasks. Rows are numbered and keyed by Spark
    SQL expressions: no Python runs on the executors before the barrier stage."""
    from pyspark.sql import functions as F

    df = _vectors_as_arrays(df)
    # The count reads every column, as the shards' read does: were the columns pruned, a shuffle
    # inside df (a join, a groupBy) would move fewer bytes, and adaptive execution could cut
    # its output into other partitions than the shards' read gets.
    fields = df.schema.fields
    by_place = df.toDF(*[f"c{i}" for i in range(len(fields))])  # names with dots, or the same twice
    every_column = F.xxhash64(*[_hashable(f"c{i}", f.dataType) for i, f in enumerate(fields)])
    partitions = by_place.select(F.spark_partition_id().alias("p"), every_column.alias("h")).groupBy("p")
    counted = partitions.agg(F.count(F.lit(1)), F.max("h")).collect()
    counts = {int(row[0]): int(row[1]) for row in counted}
    plan = plan_shards(sum(counts.values()), np, keep, name)
    # monotonically_increasing_id() is (partition id << 33) + the row's place in its partition;
    # kept in a column so that every expression below reads the same number.
    numbered = df.withColumn(INDEX, F.monotonically_increasing_id())
    partition = F.shiftright(F.col(INDEX), 33).cast("int")
    place = F.col(INDEX).bitwiseAND((1 << 33) - 1)
    index = _lookup(partition_offsets(counts), partition) + place
    keys = F.array(*[F.lit(key) for key in shard_keys(df.sparkSession, np)])
    key = F.element_at(keys, (F.pmod(index, F.lit(np)) + 1).cast("int"))
    changed = F.raise_error(F.lit(_NOT_DETERMINISTIC))
    keyed = numbered.withColumn(KEY, F.when(place >= _lookup(counts, partition), changed).otherwise(key))
    return keyed.where(index < F.lit(plan.kept)).drop(INDEX).repartition(np, KEY), plan


PARQUET_NOTE = (
    "; read by the tasks straight from its Parquet files, each rank a contiguous run of rows in "
    "file order (shuffle within your shard)"
)


@dataclass
class SparkStage:
    """What a Spark run's barrier stage reads for ``data=``: the keyed DataFrame (partition *i*
    is shard *i*), or nothing when each task reads its ``pieces`` of a Parquet scan itself."""

    keyed: Any
    sizes: list[int]
    pieces: list[list[Piece]]
    notice: str


def spark_stage(df: Any, name: str, np: int, keep: bool) -> SparkStage:
    """A plain Parquet scan is read by the tasks from its files; anything else is keyed."""
    direct = parquet_plan(df, name, np, keep)
    if direct is not None:
        pieces, split = direct
        return SparkStage(None, split.sizes(), pieces, split.notice(name) + PARQUET_NOTE)
    keyed, split = spark_shards(df, name, np, keep)
    return SparkStage(keyed, split.sizes(), [], split.notice(name))


def _hashable(name: str, data_type: Any) -> Any:
    """A column as Spark's hash takes it: one holding a map or a variant (which Spark will not
    hash, at any depth) as its JSON text."""
    from pyspark.sql import functions as F

    return F.to_json(F.struct(F.col(name))) if _holds_unhashable(data_type) else F.col(name)


def _holds_unhashable(data_type: Any) -> bool:
    kind = type(data_type).__name__
    if kind in ("MapType", "VariantType"):
        return True
    if kind == "ArrayType":
        return _holds_unhashable(data_type.elementType)
    if kind == "StructType":
        return any(_holds_unhashable(field.dataType) for field in data_type.fields)
    return False


_NOT_DETERMINISTIC = (
    "hvd_magic data: a partition of the DataFrame gave more rows when read for the shards than when "
    "counted: the DataFrame is not deterministic (it samples, or its source changed). Materialize "
    "it first, e.g. df = df.localCheckpoint()."
)


def _lookup(table: dict[int, int], partition: Any) -> Any:
    """``table[partition]`` as a Spark column (0 for a partition that is not in it)."""
    from pyspark.sql import functions as F

    pairs = [F.lit(value) for item in sorted(table.items()) for value in item]
    return F.coalesce(F.element_at(F.create_map(*pairs).cast("map<int,bigint>"), partition), F.lit(0))


_SHARD_KEYS: dict[int, list[int]] = {}  # np -> keys: Spark's hash does not change within a run of Python


def shard_keys(session: Any, np: int) -> list[int]:
    """For each shard ``i``, an int that Spark's hash partitioning sends to partition ``i`` of
    ``np`` (the same Murmur3 hash, seed 42, that ``repartition(np, column)`` uses). Asked of
    Spark once per ``np``."""
    if np not in _SHARD_KEYS:
        from pyspark.sql import functions as F

        key = F.col("id").cast("int")
        rows = session.range(0, _KEY_CANDIDATES * np).select(key, F.pmod(F.hash(key), F.lit(np))).collect()
        first: dict[int, int] = {}
        for row in rows:
            first.setdefault(int(row[1]), int(row[0]))
        if len(first) < np:
            raise DataError(
                f"hvd_magic: Spark's hash left partitions of {np} without a key; please report this"
            )
        _SHARD_KEYS[np] = [first[partition] for partition in range(np)]
    return _SHARD_KEYS[np]
