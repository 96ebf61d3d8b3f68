"""The split of rows into shards (pure), and shard files as a rank reads them."""

from __future__ import annotations

import numpy
import pyarrow as pa
import pytest

from hvd_magic import DataError
from hvd_magic.data.files import read_shard, write_shard
from hvd_magic.data.split import ShardPlan, partition_offsets, plan_shards


def test_equal_shards_drop_the_remainder_and_say_so():
    plan = plan_shards(10_003, 4)
    assert plan.sizes() == [2500] * 4 and plan.kept == 10_000
    notice = plan.notice("train_df")
    assert "10,003 rows into 4 shards of 2,500 rows" in notice
    assert "dropped the last 3" in notice and "remainder=keep" in notice


def test_keep_gives_the_first_ranks_one_row_more_and_says_so():
    plan = plan_shards(10_003, 4, keep_remainder=True)
    assert plan.sizes() == [2501, 2501, 2501, 2500] and plan.kept == 10_003
    notice = plan.notice("df")
    assert "ranks 0-2 get 2,501 rows, the others 2,500" in notice and "hvd.join()" in notice
    assert "dropped" not in notice


def test_an_even_split_says_nothing_of_a_remainder():
    notice = plan_shards(8, 2).notice("df")
    assert notice == "data=df: 8 rows into 2 shards of 4 rows"


@pytest.mark.parametrize(
    ("total", "np", "keep"), [(10, 3, False), (10, 3, True), (7, 7, False), (1000, 6, True)]
)
def test_rows_are_dealt_like_cards_and_the_sizes_hold(total, np, keep):
    plan = ShardPlan(total, np, keep)
    # Numbered in pieces (as partitions number them), the answer is the same as at once.
    pieces = [plan.shard_of(first, min(3, total - first)) for first in range(0, total, 3)]
    shard = numpy.concatenate(pieces)
    assert (shard == plan.shard_of(0, total)).all()
    assert [int((shard == s).sum()) for s in range(np)] == plan.sizes()
    assert (shard[: plan.kept] == numpy.arange(plan.kept) % np).all()  # every shard sees the whole range
    assert (shard[plan.kept :] == -1).all()


@pytest.mark.parametrize(("total", "message"), [(0, "has no rows"), (3, "fewer than the 4 ranks")])
def test_too_few_rows_is_a_clear_error(total, message):
    with pytest.raises(DataError, match=message):
        plan_shards(total, 4, name="df")


def test_partition_offsets_count_rows_of_earlier_partitions_only():
    assert partition_offsets({0: 5, 2: 3, 3: 0, 5: 1}) == {0: 0, 2: 5, 3: 8, 5: 8}


def test_a_shard_file_reads_the_same_in_every_form(tmp_path):
    table = pa.table({"id": pa.array(range(25), pa.int64()), "x": [[float(i)] * 3 for i in range(25)]})
    path = str(tmp_path / "shard.arrow")
    rows = write_shard(path, table.to_batches(max_chunksize=10), table.schema, {"rank": "1"})
    assert rows == 25 and not (tmp_path / "shard.arrow.partial").exists()
    arrow = read_shard(path, "arrow")
    assert arrow.schema.metadata == {b"hvd_magic.rank": b"1"}
    assert arrow.select(["id", "x"]).equals(table.replace_schema_metadata(arrow.schema.metadata))
    streamed = pa.Table.from_batches(list(read_shard(path, "batches")))
    assert streamed.column("id").to_pylist() == list(range(25))
    assert read_shard(path, "pandas")["id"].tolist() == list(range(25))
    with pytest.raises(ValueError, match="pandas, arrow, batches"):
        read_shard(path, "csv")


def test_shard_outside_a_run_with_data_says_how_to_get_one(monkeypatch):
    import hvd_magic

    monkeypatch.delenv("HVD_MAGIC_SHARD", raising=False)
    with pytest.raises(DataError, match="data=NAME"):
        hvd_magic.shard()


def test_parquet_row_groups_are_cut_into_consecutive_runs_of_the_shard_sizes():
    from hvd_magic.data.parquet import Piece, pieces_of

    groups = [("a", 0, 4), ("a", 1, 0), ("b", 0, 7), ("c", 0, 3)]  # 14 rows, an empty row group
    shards = pieces_of(groups, plan_shards(14, 3).sizes())  # 4 rows each, the last 2 dropped
    assert shards == [
        [Piece("a", 0, 0, 4)],
        [Piece("b", 0, 0, 4)],
        [Piece("b", 0, 4, 7), Piece("c", 0, 0, 1)],
    ]
    kept = pieces_of(groups, plan_shards(14, 3, keep_remainder=True).sizes())  # 5, 5, 4
    assert [sum(p.stop - p.start for p in shard) for shard in kept] == [5, 5, 4]
    assert kept[2][-1] == Piece("c", 0, 0, 3)  # every row, in order


def test_a_manifest_reads_its_row_ranges_and_chosen_columns_in_every_form(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hvd_magic.data.files import read_shard
    from hvd_magic.data.parquet import Piece, write_manifest

    for name, first in (("a", 0), ("b", 100)):
        table = pa.table({"id": range(first, first + 100), "x": [0.5] * 100, "label": [1] * 100})
        pq.write_table(table, tmp_path / f"{name}.parquet", row_group_size=40)  # groups of 40, 40, 20
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    chosen = ("label", "id")
    pieces = [Piece(a, 1, 30, 40, chosen), Piece(a, 2, 0, 20, chosen), Piece(b, 0, 0, 5, chosen)]
    manifest = write_manifest(str(tmp_path / "shard"), pieces, {"rank": "0"})
    expected = [*range(70, 100), *range(100, 105)]
    arrow = read_shard(manifest, "arrow")
    assert arrow.column_names == ["label", "id"] and arrow.column("id").to_pylist() == expected
    assert arrow.schema.metadata[b"hvd_magic.rank"] == b"0"
    assert read_shard(manifest, "pandas")["id"].tolist() == expected
    batches = pa.Table.from_batches(list(read_shard(manifest, "batches")))
    assert batches.column_names == ["label", "id"] and batches.column("id").to_pylist() == expected
    whole = write_manifest(str(tmp_path / "all"), [Piece(b, 2, 10, 20)], {"rank": "1"})
    assert read_shard(whole, "arrow").column_names == ["id", "x", "label"]  # None: every column


def test_every_ranks_shard_of_a_pandas_frame_has_its_columns_dtypes(tmp_path):
    """Nullable Int64 and boolean columns: the shard with a null read back as float64 and
    object, the one without as int64 and bool (pandas' own metadata was dropped)."""
    import pandas as pd

    frame = pd.DataFrame({"n": pd.array([1, None, 3, 4], "Int64"), "b": pd.array([True, None, False, True])})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    kinds = []
    for rank, rows in enumerate((table.slice(0, 2), table.slice(2, 2))):  # a null in the first only
        path = str(tmp_path / f"shard-{rank}")
        write_shard(path, rows.to_batches(), table.schema, {"rank": str(rank)})
        shard = read_shard(path, "pandas")
        kinds.append((str(shard["n"].dtype), str(shard["b"].dtype)))
    assert kinds == [("Int64", "boolean"), ("Int64", "boolean")]
    indexed = pa.Table.from_pandas(frame.set_index(pd.Index([5, 6, 7, 8], name="key")))
    write_shard(str(tmp_path / "indexed"), indexed.to_batches(), indexed.schema, {"rank": "0"})
    assert read_shard(str(tmp_path / "indexed"), "pandas")["key"].tolist() == [5, 6, 7, 8]  # a column


def test_a_parquet_file_pandas_wrote_keeps_its_index_a_column_as_spark_reads_it(tmp_path):
    """df.to_parquet() with a named index: the Parquet path's shard made it the DataFrame's
    index (shard()['key'] raised KeyError there only)."""
    import pandas as pd

    from hvd_magic.data.parquet import Piece, write_manifest

    pd.DataFrame({"key": [10, 11, 12], "x": [0.5, 1.5, 2.5]}).set_index("key").to_parquet(
        tmp_path / "a.parquet"
    )
    manifest = write_manifest(
        str(tmp_path / "shard"), [Piece(str(tmp_path / "a.parquet"), 0, 0, 3)], {"rank": "0"}
    )
    shard = read_shard(manifest, "pandas")
    assert shard["key"].tolist() == [10, 11, 12] and list(shard.columns) == ["x", "key"]
