"""Data plane benchmark: rows/s delivered into the ranks by ``data=`` from a Parquet-backed
DataFrame, against pyarrow reading the same Parquet files directly, in the same run.

Two paths are timed (np=2, each rank reads its whole shard as an Arrow table; the least of
``--repeat`` runs, the floor being the cost on a shared, noisy machine):

- the DataFrame as read (``spark.read.parquet``), a plain scan: the notebook plans the shards
  from the files' footers and the ranks read their row ranges from the files themselves
  (``data.parquet``). Its delivery is measured directly: the planning in the notebook plus the
  slowest rank's read (modules imported beforehand, as for pyarrow's own time). Target (issue
  12): >= 0.5x pyarrow's rows/s;
- the same rows through Spark (``df.where(df["id"] >= 0)`` is no plain scan): a count job, a
  shuffle that puts each shard in its partition, the barrier tasks writing each shard to a
  file, the ranks reading their file. Its delivery is measured directly too, part by part: the
  planning in the notebook (the count job), the shuffle and shard writes (the same keyed
  DataFrame written by the same function in a plain job) and the slowest rank's read. No figure
  is the difference of two runs (on this machine two launches differ by more than a read).

pyarrow is timed twice: warm, in this process, and its first read in a new process (what a
rank reading the files itself would get: a fresh process pays for its first 100 MB of memory).
For scale, the same DataFrame collected into the notebook as Arrow (``df.toArrow()``, what a user
would otherwise do before shipping it) is timed too. Each rank also times its own read. The
figures are kept for the docs (``figures.py``).

Usage: python bench/data_plane.py [--rows 5000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from figures import keep
from timing import least_seconds

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def write_parquet(directory: str, rows: int, files: int = 8) -> None:
    import numpy
    import pyarrow as pa
    import pyarrow.parquet as pq

    generator = numpy.random.default_rng(0)
    per_file = rows // files
    for index in range(files):
        ids = numpy.arange(index * per_file, (index + 1) * per_file, dtype=numpy.int64)
        table = pa.table(
            {
                "id": ids,
                "label": (ids % 10).astype(numpy.int32),
                "x": generator.standard_normal(per_file),
                "y": generator.standard_normal(per_file).astype(numpy.float32),
            }
        )
        pq.write_table(table, os.path.join(directory, f"part-{index}.parquet"))


FRESH_READ = (
    "import sys, time, pyarrow.parquet as pq\n"
    "started = time.perf_counter()\npq.read_table(sys.argv[1])\nprint(time.perf_counter() - started)"
)


def fresh_pyarrow_seconds(directory: str) -> float:
    """pyarrow's first read in a new process (modules imported first), as a rank's would be."""
    import subprocess

    command = [sys.executable, "-c", FRESH_READ, directory]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(run.stdout)


def read_shard() -> tuple[int, float]:
    """In a rank: its rows, and how long reading them took."""
    import time

    import horovod.torch as hvd
    import pyarrow.fs  # noqa: F401 - pyarrow's modules are imported before the clock starts
    import pyarrow.parquet  # noqa: F401

    import hvd_magic

    hvd.init()
    started = time.perf_counter()
    rows = int(hvd_magic.shard("arrow").num_rows)
    seconds = time.perf_counter() - started
    return rows, max(hvd.allgather_object(seconds))


def write_partitions(batches: Iterator[Any]) -> Iterator[Any]:
    """On an executor: this partition to a shard file, as a barrier task writes it before its
    rank starts (the same ``write_shard``), outside any run."""
    import pyarrow as pa

    from hvd_magic.data.files import scratch_dir, write_shard
    from hvd_magic.data.source import KEY

    path = os.path.join(scratch_dir(), f"hvd_magic-bench-{os.getpid()}-{id(batches)}.arrow")
    rows = 0
    first = next(batches, None)
    if first is not None:
        columns = [name for name in first.schema.names if name != KEY]
        rest = (batch.select(columns) for batch in batches)
        rows = write_shard(
            path, itertools.chain([first.select(columns)], rest), first.select(columns).schema, {}
        )
        os.unlink(path)
    yield pa.record_batch([pa.array([rows], pa.int64())], names=["rows"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import pyarrow.parquet as pq

    from hvd_magic import HorovodRunner
    from hvd_magic.data.source import spark_shards
    from hvd_magic.launch.embedded_spark import active_or_embedded_session
    from hvd_magic.launch.spark import SparkLauncher
    from hvd_magic.options import make_options

    session = active_or_embedded_session()
    quiet = contextlib.redirect_stdout(io.StringIO())
    in_rank: list[float] = []

    def run_with(df: object) -> None:
        with quiet, contextlib.redirect_stderr(io.StringIO()):
            in_rank.append(HorovodRunner(np=2, data=df).run(read_shard)[1])

    def plan(df: object, direct: bool = True) -> None:
        launcher = SparkLauncher.for_options(make_options(np=2, data=df))
        assert bool(launcher.pieces) == direct, "the DataFrame did not take the path the benchmark times"

    def shuffle_and_write(df: Any) -> None:
        keyed, _ = spark_shards(df, "df", 2, False)
        written = keyed.mapInArrow(write_partitions, "rows long").collect()
        assert sum(row[0] for row in written) == rows

    with tempfile.TemporaryDirectory() as directory:
        write_parquet(directory, args.rows)
        rows = pq.read_table(directory).num_rows
        df = session.read.parquet(directory)
        through_spark = df.where(df["id"] >= 0)  # a filter: no plain scan, the same rows
        pyarrow_seconds = least_seconds(lambda: pq.read_table(directory), args.repeat)
        fresh_seconds = min(fresh_pyarrow_seconds(directory) for _ in range(args.repeat))
        collect_seconds = least_seconds(df.toArrow, args.repeat)
        plan_seconds = least_seconds(lambda: plan(df), args.repeat)
        direct_seconds = least_seconds(lambda: run_with(df), args.repeat)
        read_seconds = min(in_rank)
        in_rank.clear()
        spark_plan_seconds = least_seconds(lambda: plan(through_spark, direct=False), args.repeat)
        write_seconds = least_seconds(lambda: shuffle_and_write(through_spark), args.repeat)
        spark_seconds = least_seconds(lambda: run_with(through_spark), args.repeat)
        spark_read_seconds = min(in_rank)
    direct = plan_seconds + read_seconds
    general = spark_plan_seconds + write_seconds + spark_read_seconds
    print(f"data plane: {rows:,} Parquet rows, np=2, least of {args.repeat}, {os.cpu_count()} cores")
    lines = [
        ("pyarrow reads the files directly", pyarrow_seconds, True),
        ("  the same, first read in a new process", fresh_seconds, True),
        ("Spark df.toArrow() in the notebook", collect_seconds, True),
        ("run with data=df, plain Parquet scan", direct_seconds, False),
        ("  planning the shards (notebook)", plan_seconds, False),
        ("  the slowest rank's read", read_seconds, False),
        ("  delivery (the two)", direct, True),
        ("run with data= through Spark's rows", spark_seconds, False),
        ("  planning the shards (count job)", spark_plan_seconds, False),
        ("  shuffle + shard files (plain job)", write_seconds, False),
        ("  the slowest rank's read", spark_read_seconds, False),
        ("  delivery (the three)", general, True),
    ]
    for label, seconds, rate in lines:
        print(f"  {label:38} {seconds:6.2f} s" + (f" {rows / seconds:14,.0f} rows/s" if rate else ""))
    print(
        f"delivery, plain Parquet scan: {pyarrow_seconds / direct:.2f}x pyarrow's rows/s (target >= 0.5), "
        f"{fresh_seconds / direct:.2f}x pyarrow's in a new process; "
        f"through Spark's rows: {pyarrow_seconds / general:.2f}x pyarrow, {collect_seconds / general:.2f}x "
        "Spark's toArrow()"
    )
    keep(
        "data_plane",
        {
            "pyarrow_rate": f"{rows / pyarrow_seconds / 1e6:.0f}M rows/s",
            "direct": f"{direct:.2f} s",
            "direct_plan": f"{plan_seconds * 1000:.0f} ms",
            "direct_rate": f"{rows / direct / 1e6:.0f}M rows/s",
            "direct_pyarrow": f"{pyarrow_seconds / direct:.2f}x",
            "direct_fresh": f"{fresh_seconds / direct:.2f}x",
            "spark_rate": f"{rows / general / 1e6:.1f}M rows/s",
            "spark_pyarrow": f"{pyarrow_seconds / general:.2f}x",
            "spark_to_arrow": f"{collect_seconds / general:.2f}x",
        },
    )
    session.stop()


if __name__ == "__main__":
    main()
