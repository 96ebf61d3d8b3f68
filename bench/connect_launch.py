"""Launch on a Spark Connect session beside a classic one: cell start -> every rank finished a
trivial allreduce, np=2, warm session, both on ``local[4]``, mpi and gloo.

A local Connect server lives in the JVM of the process that starts it, so each kind of session
runs in a child process of this one; the ratios are printed here, from the same run.

Usage: python bench/connect_launch.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time

from figures import keep

MASTER = "local[4]"


def trivial_allreduce() -> float:
    import horovod.torch as hvd
    import torch

    hvd.init()
    return float(hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item())


def measure(kind: str, repeat: int) -> dict[str, float]:
    """In the child: median seconds per launcher on a session of ``kind``."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from hvd_magic import HorovodRunner

    builder = SparkSession.builder.config("spark.ui.enabled", "false")
    session = (builder.remote(MASTER) if kind == "connect" else builder.master(MASTER)).getOrCreate()
    medians = {}
    for launcher in ("mpi", "gloo"):
        times = []
        for attempt in range(repeat + 1):  # the first one warms up the Python workers
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                HorovodRunner(np=2, launcher=launcher).run(trivial_allreduce)
            if attempt:
                times.append(time.perf_counter() - started)
        medians[launcher] = statistics.median(times)
    session.stop()
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--child", choices=["classic", "connect"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.repeat)))
        return
    results = {}
    for kind in ("classic", "connect"):
        done = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--repeat", str(args.repeat)],
            capture_output=True,
            text=True,
            check=True,
        )
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"launch on Spark Connect beside classic: np=2, {MASTER}, median of {args.repeat}")
    figures: dict[str, str] = {}
    for launcher in ("mpi", "gloo"):
        classic, connect = results["classic"][launcher], results["connect"][launcher]
        ratio = connect / classic
        print(f"  {launcher:5s} classic {classic:6.2f} s  connect {connect:6.2f} s  ({ratio:.2f}x)")
        figures |= {
            f"classic_{launcher}": f"{classic:.2f} s",
            f"connect_{launcher}": f"{connect:.2f} s",
            f"connect_{launcher}_classic": f"{ratio:.2f}x",
        }
    keep("connect_launch", figures)


if __name__ == "__main__":
    main()
