"""Idle ranks benchmark: what a live session's ranks cost while they wait between calls.

A ``hvd_magic.Session(np=-2)`` per launcher; each rank reads its own CPU time (all its threads,
Horovod's background thread among them) before and after a pause with nothing to do. Measured in
the same run: Gloo's ranks (Horovod as released: its waits sleep) are the baseline for MPI's,
whose negotiation is a collective that busy-waits. Target (the build's edit for idle ranks, see
docs/installing.md): an idle MPI rank costs no more than an idle Gloo rank (<= 1x); Horovod as
released spun about one core for the MPI rank that came first to each cycle (8.0 CPU-s in 8 s).

``--spark``: three MPI ranks of a session on a local-cluster (two executors of two slots), whose
waits yield the core (hvd_magic's setting, ``OMPI_MCA_mpi_yield_when_idle=1``) against the
same ranks spinning as Open MPI would by itself there (the variable set to 0 through ``env=``,
the baseline, measured in the same run). Target: yielding costs at most half. The figures are
kept for the docs (``figures.py``: ``idle_ranks``, ``idle_ranks_spark``).

Usage: python bench/idle_ranks.py [--pause 8] [--repeat 3] [--spark]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from figures import keep

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_seconds() -> list[float]:
    """Every rank's CPU time so far (user and system, all threads)."""
    import resource

    import horovod.torch as hvd

    used = resource.getrusage(resource.RUSAGE_SELF)
    return list(hvd.allgather_object(used.ru_utime + used.ru_stime))


def idle_cost(
    launcher: str, pause: float, repeat: int, np: int = -2, env: dict[str, str] | None = None
) -> list[float]:
    """The CPU-s each rank took in each pause: ``repeat`` pauses, the ranks' costs of each."""
    import hvd_magic

    costs = []
    with hvd_magic.Session(np=np, launcher=launcher, env=env) as session:
        for _ in range(repeat):
            before = session.run(cpu_seconds)
            time.sleep(pause)  # the pause measured: the ranks wait for the next call
            after = session.run(cpu_seconds)
            costs += [end - start for start, end in zip(before, after, strict=True)]
    return costs


def on_spark(pause: float, repeat: int) -> dict[str, str]:
    from pyspark.sql import SparkSession

    from tests import spark_jvm  # the suite's small JVMs

    os.environ |= spark_jvm.environment() | {"PYSPARK_PYTHON": sys.executable}
    spark = (
        SparkSession.builder.master("local-cluster[2,2,1024]").config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )  # fmt: skip
    try:
        spinning = idle_cost("mpi", pause, repeat, np=3, env={"OMPI_MCA_mpi_yield_when_idle": "0"})
        yielding = idle_cost("mpi", pause, repeat, np=3)
    finally:
        spark.stop()
    cores = os.cpu_count()
    print(f"idle ranks on Spark: np=3 on a local-cluster, {repeat} pauses of {pause:.0f} s, {cores} cores")
    for name, costs in (("spinning (baseline)", spinning), ("yielding", yielding)):
        median, most = statistics.median(costs), max(costs)
        print(f"  {name:<20} CPU-s per rank per pause: median {median:5.2f}, most {most:5.2f}")
    ratio = statistics.median(yielding) / statistics.median(spinning)
    print(f"  yielding / spinning, median: {ratio:.2f}x (<= 0.5)")
    return {
        "spinning": f"{statistics.median(spinning):.2f} CPU-s",
        "yielding": f"{statistics.median(yielding):.2f} CPU-s",
        "yielding_spinning": f"{ratio:.2f}x",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause", type=float, default=8.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--spark", action="store_true", help="MPI ranks on a local-cluster: yielding against spinning"
    )
    args = parser.parse_args()
    if args.spark:
        keep("idle_ranks_spark", on_spark(args.pause, args.repeat))
        return
    gloo = idle_cost("gloo", args.pause, args.repeat)
    mpi = idle_cost("mpi", args.pause, args.repeat)
    print(f"idle ranks benchmark: np=2, {args.repeat} pauses of {args.pause:.0f} s, {os.cpu_count()} cores")
    for name, costs in (("gloo (baseline)", gloo), ("mpi", mpi)):
        share = statistics.median(costs) / args.pause
        print(f"  {name:<16} CPU-s per rank per pause: median {statistics.median(costs):5.2f}, "
              f"most {max(costs):5.2f} ({share:.0%} of a core)")  # fmt: skip
    ratio = statistics.median(mpi) / statistics.median(gloo)
    print(f"  mpi / gloo, median: {ratio:.2f}x (<= 1); most: {max(mpi) / max(gloo):.2f}x")
    figures = {
        "gloo": f"{statistics.median(gloo):.2f} CPU-s",
        "mpi": f"{statistics.median(mpi):.2f} CPU-s",
        "mpi_most": f"{max(mpi):.2f} CPU-s",
        "mpi_gloo": f"{ratio:.2f}x",
    }
    keep("idle_ranks", figures)


if __name__ == "__main__":
    main()
