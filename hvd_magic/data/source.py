"""Notebook side of ``data=``: what it accepts, and how its rows become shards.

Locally (np < 0) the notebook writes one Arrow file per rank. On Spark the rows stay on the
executors: one cheap job counts the rows of each partition (only the partition ids are read),
then each row gets the key of its shard and a hash repartition on that key puts shard ``i``
exactly in partition ``i`` of the barrier stage. The keys are chosen by asking Spark which
small integers its own hash sends to which partition, so this works on classic and Spark
Connect sessions alike, with the DataFrame API only.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy

from ..errors import DataError
from .split import ShardPlan, partition_offsets, plan_shards

__all__ = ["KEY", "check_source", "local_shards", "spark_shards", "spark_dataframe"]

KEY = "__hvd_magic_shard"  # the shard key column; the barrier task drops it before writing
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
    """Spark ML vector columns (e.g. from a VectorAssembler) as arrays of doubles."""
    vectors = [f.name for f in df.schema.fields if type(f.dataType).__name__ == "VectorUDT"]
    if vectors:
        from pyspark.ml.functions import vector_to_array

        for column in vectors:
            df = df.withColumn(column, vector_to_array(column))
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
    from .files import write_shard

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
    and the split, for a barrier stage of ``np`` tasks."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, StructField, StructType

    df = _vectors_as_arrays(df)
    counted = df.select(F.spark_partition_id().alias("p")).groupBy("p").count().collect()
    counts = {int(row[0]): int(row[1]) for row in counted}
    plan = plan_shards(sum(counts.values()), np, keep, name)
    schema = StructType([*df.schema.fields, StructField(KEY, IntegerType(), True)])
    keyed = df.mapInArrow(functools.partial(key_rows, counts, plan, shard_keys(df.sparkSession, np)), schema)
    return keyed.repartition(np, KEY), plan


@functools.lru_cache(maxsize=64)
def _keys(np: int, found: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    first: dict[int, int] = {}
    for key, partition in found:
        first.setdefault(partition, key)
    if len(first) < np:
        raise DataError(f"hvd_magic: Spark's hash left partitions of {np} without a key; please report this")
    return tuple(first[partition] for partition in range(np))


def shard_keys(session: Any, np: int) -> list[int]:
    """For each shard ``i``, an int that Spark's hash partitioning sends to partition ``i`` of
    ``np`` (the same Murmur3 hash, seed 42, that ``repartition(np, column)`` uses)."""
    from pyspark.sql import functions as F

    key = F.col("id").cast("int")
    rows = session.range(0, _KEY_CANDIDATES * np).select(key, F.pmod(F.hash(key), F.lit(np))).collect()
    return list(_keys(np, tuple((int(row[0]), int(row[1])) for row in rows)))


def key_rows(
    counts: dict[int, int], plan: ShardPlan, keys: list[int], batches: Iterator[Any]
) -> Iterator[Any]:
    """On an executor: number this partition's rows, drop the remainder, add each row's shard key."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None  # on an executor, in a task
    partition = context.partitionId()
    first, seen = partition_offsets(counts).get(partition, 0), 0
    key_of = numpy.asarray(keys, dtype=numpy.int32)
    for batch in batches:
        shard = plan.shard_of(first + seen, batch.num_rows)
        seen += batch.num_rows
        keyed = batch.append_column(KEY, pa.array(key_of[numpy.maximum(shard, 0)], pa.int32()))
        yield keyed.filter(pa.array(shard >= 0))
    if seen != counts.get(partition, 0):
        raise DataError(
            f"hvd_magic data: partition {partition} gave {seen} rows when read for the shards but "
            f"{counts.get(partition, 0)} when counted: the DataFrame is not deterministic (it samples, "
            "or its source changed). Materialize it first, e.g. df = df.localCheckpoint()."
        )
