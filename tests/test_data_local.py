"""data= on this machine (np < 0): pandas and Arrow input, shards as the ranks read them, and
bad input refused before anything starts."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from IPython.core.error import UsageError

from hvd_magic import DataError, HorovodRunner

from .data_cells import all_ids, run_shard_cell
from .helpers import leftover_processes

if TYPE_CHECKING:
    import pandas as pd


def frame(rows: int) -> pd.DataFrame:
    import pandas as pd  # here: collecting the module does not import pandas

    return pd.DataFrame({"id": range(rows), "features": [[float(i), 1.0] for i in range(rows)]})


def test_each_rank_reads_its_equal_shard_of_a_pandas_dataframe(ip, tmp_path, capsys):
    ip.user_ns["train"] = frame(103)
    ranks = run_shard_cell(ip, "np=-2 data=train", tmp_path)
    assert [len(r["ids"]) for r in ranks] == [51, 51]
    assert all_ids(ranks) == list(range(102))  # dealt in order: the last row is the remainder
    assert ranks[0]["ids"][:3] == [0, 2, 4] and ranks[1]["ids"][:3] == [1, 3, 5]
    assert all(r["same"] for r in ranks)  # pandas, arrow and batches give the same rows
    assert ranks[0]["types"]["features"] == "list<item: double>"
    shown = capsys.readouterr().err
    assert "data=train: 103 rows into 2 shards of 51 rows; dropped the last 1" in shown
    assert not any(os.path.exists(r["shard_file"]) for r in ranks)  # removed with the run
    assert leftover_processes() == []


def test_keep_remainder_with_an_arrow_table_through_the_function_api():
    table = pa.table({"id": pa.array(range(7), pa.int64())})

    def main():
        import hvd_magic

        return len(hvd_magic.shard())

    runner = HorovodRunner(np=-3, launcher="gloo", data=table, remainder="keep")
    assert runner.run(main) == 3  # rank 0 of 3, 3, 2 rows


@pytest.mark.parametrize(
    "setup, line, message",
    [
        ("", "np=-2 data=nothing", "the notebook has no variable 'nothing'"),
        ("rows = [1, 2]", "np=-2 data=rows", "data=rows is a builtins.list; data= takes a Spark DataFrame"),
        ("", "np=-2 remainder=keep", "give data="),
        ("import pandas; empty = pandas.DataFrame({'id': []})", "np=-2 data=empty", "data=empty has no rows"),
        ("import pandas; few = pandas.DataFrame({'id': [1]})", "np=-2 data=few", "fewer than the 2 ranks"),
    ],
)
def test_bad_data_is_refused_before_anything_starts(ip, setup, line, message, capsys):
    ip.run_cell(setup)
    with pytest.raises((UsageError, DataError), match=message):
        ip.run_cell_magic("horovod", line, "import time; time.sleep(600)")
    ip.run_cell(f"%%horovod {line}\n1")  # as a notebook shows it: the message, no traceback
    shown = capsys.readouterr()
    assert message in shown.out + shown.err and "Traceback" not in shown.out + shown.err
    assert leftover_processes() == []
