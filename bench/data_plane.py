"""Data plane benchmark: rows/s delivered into the ranks by ``data=`` from a Parquet-backed
DataFrame, against pyarrow reading the same Parquet files directly, in the same run.

For hvd_magic the time is the run with ``data=`` (each of np=2 ranks reads its whole shard as an
Arrow table) less the same run without data (the launch), so it is what delivery costs. The
run goes through Spark: a count job, a shuffle that puts each shard in its partition, and the
barrier tasks writing each shard to a file on its executor. Target (issue 12): >= 0.5x. For
scale, the same DataFrame collected into the notebook as Arrow (``df.toArrow()``, what a user
would otherwise do before shipping it) is timed too.

Usage: python bench/data_plane.py [--rows 3000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile

from timing import median_seconds

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


def read_shard_rows() -> int:
    import hvd_magic

    return int(hvd_magic.shard("arrow").num_rows)


def launch_only() -> int:
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import pyarrow.parquet as pq

    from hvd_magic import HorovodRunner
    from hvd_magic.launch.spark_session import active_or_embedded_session

    session = active_or_embedded_session()
    quiet = contextlib.redirect_stdout(io.StringIO())
    with tempfile.TemporaryDirectory() as directory:
        write_parquet(directory, args.rows)
        rows = pq.read_table(directory).num_rows
        df = session.read.parquet(directory)

        def with_data() -> object:
            with quiet, contextlib.redirect_stderr(io.StringIO()):
                return HorovodRunner(np=2, data=df).run(read_shard_rows)

        def without_data() -> object:
            with quiet:
                return HorovodRunner(np=2).run(launch_only)

        pyarrow_seconds = median_seconds(lambda: pq.read_table(directory), args.repeat)
        collect_seconds = median_seconds(df.toArrow, args.repeat)
        data_seconds = median_seconds(with_data, args.repeat)
        launch_seconds = median_seconds(without_data, args.repeat)
    delivery = max(data_seconds - launch_seconds, 1e-9)
    print(f"data plane: {rows:,} Parquet rows, np=2, median of {args.repeat}, {os.cpu_count()} cores")
    pyarrow_rate = rows / pyarrow_seconds
    print(f"  pyarrow reads the files directly    {pyarrow_seconds:7.2f} s  {pyarrow_rate:14,.0f} rows/s")
    collect_rate = rows / collect_seconds
    print(f"  Spark df.toArrow() in the notebook  {collect_seconds:7.2f} s  {collect_rate:14,.0f} rows/s")
    print(f"  hvd_magic run with data= (total)    {data_seconds:7.2f} s")
    print(f"  hvd_magic run without data (launch) {launch_seconds:7.2f} s")
    print(f"  delivery into the ranks             {delivery:7.2f} s  {rows / delivery:14,.0f} rows/s")
    print(
        f"delivery: {pyarrow_seconds / delivery:.2f}x pyarrow's rows/s (target >= 0.5), "
        f"{collect_seconds / delivery:.2f}x Spark's toArrow()"
    )
    session.stop()


if __name__ == "__main__":
    main()
