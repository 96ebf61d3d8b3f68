"""data= on a real local-cluster (two executor JVMs): every row in exactly one shard, each
shard written on the executor of the rank that reads it, ML vectors as arrays, bad data
refused before launch, and the same DataFrame on this machine (np < 0). A plain Parquet scan
is read by the ranks from the files; anything else on it goes through Spark's rows."""

from __future__ import annotations

import pytest

from hvd_magic import DataError, HorovodRunner

from .data_cells import all_ids, run_shard_cell
from .helpers import leftover_processes, run_processes_anywhere
from .spark_fixtures import TWO_EXECUTORS_FOUR_GPUS, gpu_conf, shared_spark_session

ROWS = 10_003


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    conf = gpu_conf(tmp_path_factory.getbasetemp() / "gpus")  # the launch tests' cluster, shared
    with shared_spark_session(TWO_EXECUTORS_FOUR_GPUS, conf) as session:
        from hvd_magic.launch.spark_session import check_slots

        check_slots(session, 4, wait=60)  # executors register after the session starts
        yield session


@pytest.fixture(scope="module")
def train_df(spark):
    from pyspark.ml.feature import VectorAssembler

    df = spark.range(0, ROWS, numPartitions=7).selectExpr(
        "id", "cast(id % 10 as int) as label", "cast(id as double) as x", "cast(id * 2 as double) as y"
    )
    return VectorAssembler(inputCols=["x", "y"], outputCol="features").transform(df)


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_every_row_reaches_exactly_one_rank_from_the_ranks_own_executor(
    ip, train_df, launcher, tmp_path, capsys
):
    ip.user_ns["train_df"] = train_df
    ranks = run_shard_cell(ip, f"np=4 launcher={launcher} data=train_df", tmp_path)
    assert [len(r["ids"]) for r in ranks] == [2500] * 4
    ids = all_ids(ranks)
    assert len(ids) == len(set(ids)) == 10_000 and set(ids) <= set(range(ROWS))
    assert all(r["same"] for r in ranks)
    for rank in ranks:
        assert rank["executor"] is not None, rank  # the rank runs under an executor JVM ...
        assert rank["writer_executor"] == rank["executor"], rank  # ... which also wrote its shard
        assert rank["shard_file"].startswith(rank["executor_dirs"].split(":")[0] + "/")  # in its scratch dir
    assert len({r["executor"] for r in ranks}) == 2  # spread over both executors
    assert ranks[0]["types"]["features"].startswith("list<element: double")  # an ML vector, as an array
    assert ranks[0]["types"]["label"] == "int32"
    notice = "data=train_df: 10,003 rows into 4 shards of 2,500 rows; dropped the last 3"
    assert notice in capsys.readouterr().err
    assert run_processes_anywhere() == [] and leftover_processes() == []


def test_keep_remainder_and_the_function_api(train_df):
    def main():
        import json

        import horovod.torch as hvd

        import hvd_magic

        hvd.init()
        return [json.loads(s) for s in hvd.allgather_object(json.dumps(len(hvd_magic.shard("arrow"))))]

    assert HorovodRunner(np=4, data=train_df, remainder="keep").run(main) == [2501, 2501, 2501, 2500]


def test_a_spark_dataframe_on_this_machine(ip, train_df, tmp_path):
    ip.user_ns["train_df"] = train_df.limit(101)
    ranks = run_shard_cell(ip, "np=-2 data=train_df", tmp_path)
    assert [len(r["ids"]) for r in ranks] == [50, 50] and len(set(all_ids(ranks))) == 100


@pytest.mark.parametrize(("rows", "message"), [(0, "has no rows"), (3, "3 rows, fewer than the 4 ranks")])
def test_too_little_data_is_refused_before_launch(spark, rows, message):
    with pytest.raises(DataError, match=message):
        HorovodRunner(np=4, data=spark.range(rows)).run(lambda: None)
    assert run_processes_anywhere() == []


def test_a_dataframe_that_reads_differently_each_time_is_a_clear_error(spark):
    import random

    from pyspark.sql import functions as F

    from hvd_magic import RunError

    coin = F.udf(lambda _: random.random(), "double").asNondeterministic()
    df = spark.range(0, 2000, numPartitions=7).where(coin("id") < 0.5)
    with pytest.raises(RunError) as info:
        HorovodRunner(np=2, data=df).run(lambda: None)
    assert "the DataFrame is not deterministic" in str(info.value) and "localCheckpoint" in str(info.value)
    assert run_processes_anywhere() == []
    # Materialized, the same DataFrame splits.
    assert HorovodRunner(np=2, data=df.localCheckpoint()).run(_shard_rows) > 0


def test_a_groupby_that_adaptive_execution_coalesces_splits_exactly(spark):
    """The count and the shards' read must see the same partitions of an aggregated
    DataFrame (its columns of any type): with its columns pruned, the count's shuffle
    is smaller, and adaptive execution (with a small advisory size, as large data would have
    it) coalesced it differently."""
    from pyspark.sql import functions as F

    df = (
        spark.range(0, 20_000, numPartitions=4)
        .select((F.col("id") % 500).alias("key"), F.repeat(F.lit("x"), 200).alias("pad"))
        .groupBy("key")
        .agg(
            F.max("pad").alias("pad"),
            F.count("*").alias("rows"),
            F.create_map(F.lit("k"), F.lit(1)).alias("m"),
        )
        .withColumn("nested", F.array(F.create_map(F.lit("k"), F.col("rows"))))  # Spark hashes no map
    )

    def keys():
        import horovod.torch as hvd

        import hvd_magic

        hvd.init()
        return hvd.allgather_object(sorted(hvd_magic.shard()["key"].tolist()))

    small = {"spark.sql.adaptive.advisoryPartitionSizeInBytes": "2k"}
    small["spark.sql.adaptive.coalescePartitions.minPartitionSize"] = "1"
    saved = {key: spark.conf.get(key, None) for key in small}
    try:
        for key, value in small.items():
            spark.conf.set(key, value)
        shards = HorovodRunner(np=2, data=df).run(keys)
    finally:
        for key, value in saved.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)
    assert [len(shard) for shard in shards] == [250, 250]
    assert sorted(key for shard in shards for key in shard) == list(range(500))


def _shard_rows() -> int:
    import hvd_magic

    return len(hvd_magic.shard())


PARQUET_NOTICE = "read by the tasks straight from its Parquet files"


@pytest.fixture(scope="module")
def parquet_dir(spark, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("parquet") / "train")
    spark.range(0, ROWS, numPartitions=5).selectExpr("id", "cast(id % 10 as int) as label").write.parquet(
        folder
    )
    return folder


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_a_plain_parquet_scan_is_read_by_the_ranks_from_the_files(
    ip, spark, parquet_dir, launcher, tmp_path, capsys
):
    ip.user_ns["train_df"] = spark.read.parquet(parquet_dir)
    ranks = run_shard_cell(ip, f"np=4 launcher={launcher} data=train_df", tmp_path)
    assert [len(r["ids"]) for r in ranks] == [2500] * 4
    ids = all_ids(ranks)
    assert len(ids) == len(set(ids)) == 10_000 and set(ids) <= set(range(ROWS))
    assert all(r["same"] for r in ranks)  # pandas, Arrow and streamed batches: the same rows
    assert all(r["shard_file"].endswith(".pieces.json") for r in ranks)  # row ranges, not rows
    for rank in ranks:
        assert rank["writer_executor"] == rank["executor"] is not None, (
            rank
        )  # handed over on the rank's executor
    assert ranks[0]["types"] == {"id": "int64", "label": "int32"}
    err = capsys.readouterr().err
    assert "data=train_df: 10,003 rows into 4 shards of 2,500 rows; dropped the last 3" in err
    assert PARQUET_NOTICE in err
    assert run_processes_anywhere() == [] and leftover_processes() == []


def test_a_choice_of_columns_of_a_parquet_scan_is_read_from_the_files(
    ip, spark, parquet_dir, tmp_path, capsys
):
    ip.user_ns["train_df"] = spark.read.parquet(parquet_dir).select("label", "id")
    ranks = run_shard_cell(ip, "np=2 data=train_df", tmp_path)
    assert len(set(all_ids(ranks))) == 10_002 and all(r["same"] for r in ranks)
    assert list(ranks[0]["types"]) == ["label", "id"]  # the columns chosen, in their order
    assert all(r["shard_file"].endswith(".pieces.json") for r in ranks)
    assert PARQUET_NOTICE in capsys.readouterr().err


def test_parquet_files_with_different_columns_go_through_sparks_rows(ip, spark, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "mixed"
    folder.mkdir()
    wide = pa.table({"id": range(0, 50), "label": [1] * 50, "extra": [0.5] * 50})
    pq.write_table(wide, folder / "a.parquet")
    pq.write_table(pa.table({"id": range(50, 100), "label": [2] * 50}), folder / "b.parquet")  # no extra
    merged = spark.read.option("mergeSchema", "true").parquet(str(folder))
    ip.user_ns["train_df"] = merged.select("id", "extra")  # Spark gives b's rows a null extra
    ranks = run_shard_cell(ip, "np=2 data=train_df", tmp_path)
    assert sorted(all_ids(ranks)) == list(range(100))
    assert not any(r["shard_file"].endswith(".pieces.json") for r in ranks)
    assert PARQUET_NOTICE not in capsys.readouterr().err


def test_anything_more_than_a_parquet_scan_goes_through_sparks_rows(ip, spark, parquet_dir, capsys, tmp_path):
    ip.user_ns["train_df"] = spark.read.parquet(parquet_dir).where("id % 2 = 0")  # 5,002 rows
    ranks = run_shard_cell(ip, "np=2 data=train_df", tmp_path)
    assert sorted(all_ids(ranks)) == list(range(0, ROWS, 2))
    assert not any(r["shard_file"].endswith(".pieces.json") for r in ranks)
    assert PARQUET_NOTICE not in capsys.readouterr().err
    ip.user_ns["train_df"] = spark.read.parquet(parquet_dir).selectExpr("id", "label * 2 as label")
    ranks = run_shard_cell(ip, "np=2 data=train_df", tmp_path)  # a computed column
    assert not any(r["shard_file"].endswith(".pieces.json") for r in ranks)
    assert PARQUET_NOTICE not in capsys.readouterr().err
    # Partition directories: their column is not in the files, so Spark's rows it is.
    partitioned = str(tmp_path / "by_label")
    spark.read.parquet(parquet_dir).write.partitionBy("label").parquet(partitioned)
    ip.user_ns["train_df"] = spark.read.parquet(partitioned)
    ranks = run_shard_cell(ip, "np=2 data=train_df", tmp_path)
    assert len(set(all_ids(ranks))) == 10_002 and "label" in ranks[0]["types"]
    assert PARQUET_NOTICE not in capsys.readouterr().err
