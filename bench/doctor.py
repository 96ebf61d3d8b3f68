"""doctor on a warm Spark session: seconds for every check (this machine's, the session's, and the
executors' job that reports their Python and packages and connects back to the notebook), against
a trivial Spark job on the same session measured in the same run.

Target: <= 10 s on a warm session (the issue's "fast and safe to run any time"). The figures are
kept for the docs (``figures.py``).

Usage: python bench/doctor.py [--master local-cluster[2,1,1024]] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys

from figures import keep
from timing import median_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from hvd_magic.doctor import doctor

    spark = SparkSession.builder.master(args.master).config("spark.ui.enabled", "false").getOrCreate()
    try:
        job = median_seconds(lambda: spark.range(0, 2, 1, 2).rdd.map(lambda x: x).count(), args.repeat)
        report = doctor(spark)
        seconds = median_seconds(lambda: doctor(spark), args.repeat)
    finally:
        spark.stop()
    print(f"doctor benchmark on {args.master} (warm session, median of {args.repeat}):")
    print(f"  a trivial Spark job           {job:6.2f} s")
    checks = "all passed" if report.ok else f"failed: {', '.join(c.name for c in report.failed)}"
    print(f"  doctor, {len(report.checks)} checks ({checks})  {seconds:6.2f} s  (target <= 10; "
          f"{seconds / job:.1f}x the trivial job)")  # fmt: skip
    keep("doctor", {"warm": f"{seconds:.2f} s", "job": f"{job:.2f} s", "warm_job": f"{seconds / job:.1f}x"})


if __name__ == "__main__":
    main()
