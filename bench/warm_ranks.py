"""Warm ranks benchmark: what a PyTorch (or Keras) cell costs with its ranks forked from a fork server
(``warm.choice``) against the same cell with every rank started anew (``HVD_MAGIC_WARM_RANKS=0``),
measured in turn in the same run: local ranks, or with ``--spark MASTER`` ranks on Spark's
executors (whose tasks' Python workers keep the servers).

Per cell: wall time, and the CPU time of the whole machine meanwhile (``/proc/stat``: the
ranks, mpirun and the server are not all this process's children, so their own counters cannot
be summed here; run it on an otherwise idle machine). The cell is a small Horovod step
(``hvd.init()``, one allreduce; ``--framework keras``: Horovod's Keras binding on TensorFlow;
``--framework none``: a cell of no framework, forked from a server of the rank's modules only),
so its cost is mostly the start. The first warm cell, which
starts the server (on Spark: each worker's), is shown on its own. The figures are kept for the
docs (``figures.py``: ``warm_ranks``, with ``_spark``, ``_keras`` or ``_none`` after it for those
options).

Usage: python bench/warm_ranks.py [--ranks 2] [--repeat 5] [--launcher mpi] [--framework torch]
                                  [--spark local-cluster[2,1,1024]]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from figures import keep
from timing import QuietView

from hvd_magic.options import make_options
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks
from hvd_magic.warm.choice import ENV_WARM_RANKS

CELLS = {
    "torch": (
        "import horovod.torch as hvd, torch\nhvd.init()\n"
        "hvd.allreduce(torch.ones(4), name='x').sum().item()\n"
    ),
    "keras": (
        "import tensorflow as tf, horovod.tensorflow.keras as hvd\nhvd.init()\n"
        "float(tf.reduce_sum(hvd.allreduce(tf.ones(4), name='x')))\n"
    ),
    "none": "import os\n4.0 + 0 * os.getpid()\n",  # no framework: the start is all it costs
}


def busy_seconds() -> float:
    """CPU seconds the machine has spent busy (user, nice, system, irq, softirq) since boot."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def one_cell(ranks: int, launcher: str, warm: bool, cell: str) -> tuple[float, float]:
    """``ranks`` < 0: on this machine; > 0: on the active Spark session."""
    os.environ[ENV_WARM_RANKS] = "1" if warm else "0"
    options = make_options(np=ranks, launcher=launcher)
    cpu, started = busy_seconds(), time.perf_counter()
    value, _ = run_on_ranks(pack_cell(cell, {}), options, QuietView())
    assert value == 4.0, value  # the average of ones
    return time.perf_counter() - started, busy_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--launcher", default="mpi", choices=("mpi", "gloo"))
    parser.add_argument("--framework", default="torch", choices=sorted(CELLS))
    parser.add_argument("--spark", metavar="MASTER", help="ranks on this Spark master's executors")
    args = parser.parse_args()
    if args.spark and args.framework == "none":
        parser.error("--framework none: Spark's ranks of no framework start the usual way (warm.choice)")
    cell = CELLS[args.framework]
    ranks, where = -args.ranks, "on this machine"
    if args.spark:
        start_spark(args.spark, args.ranks)
        ranks, where = args.ranks, f"on {args.spark}"
    one_cell(ranks, args.launcher, False, cell)  # page cache warm for both
    first_wall, first_cpu = one_cell(ranks, args.launcher, True, cell)  # starts the server
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for index in range(2 * args.repeat):
        warm = index % 2 == 1  # in turn
        runs[warm].append(one_cell(ranks, args.launcher, warm, cell))
    kind = "a cell of no framework" if args.framework == "none" else f"a Horovod-{args.framework} cell"
    described = f"launcher={args.launcher}, {kind}, medians of {args.repeat}"
    print(f"np={ranks} {where}, {described}:")
    medians = {}
    for warm, label in ((False, "started anew"), (True, "warm (forked)")):
        wall = statistics.median(run[0] for run in runs[warm])
        cpu = statistics.median(run[1] for run in runs[warm])
        medians[warm] = (wall, cpu)
        print(f"  {label:<14} {wall:6.2f} s wall  {cpu:6.2f} CPU-s")
    print(f"  first warm cell (starts the server): {first_wall:.2f} s wall, {first_cpu:.2f} CPU-s")
    (cold_wall, cold_cpu), (warm_wall, warm_cpu) = medians[False], medians[True]
    ratios = f"{warm_wall / cold_wall:.2f}x the wall time, {warm_cpu / cold_cpu:.2f}x the CPU"
    print(f"warm / started anew: {ratios}")
    bench = (
        "warm_ranks"
        + ("_spark" if args.spark else "")
        + ("" if args.framework == "torch" else f"_{args.framework}")
    )
    figures = {
        "warm": f"{warm_wall:.2f} s",
        "warm_cpu": f"{warm_cpu:.2f} CPU-s",
        "anew": f"{cold_wall:.2f} s",
        "anew_cpu": f"{cold_cpu:.2f} CPU-s",
        "wall_ratio": f"{warm_wall / cold_wall:.2f}x",
        "cpu_ratio": f"{warm_cpu / cold_cpu:.2f}x",
        "first": f"{first_wall:.2f} s",
    }
    keep(bench, figures)


def start_spark(master: str, ranks: int) -> None:
    """The session the cells run on (the active one), its executors registered."""
    from pyspark.sql import SparkSession

    from hvd_magic.launch.spark_session import check_slots

    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master(master).config("spark.ui.enabled", "false")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    session = builder.config("spark.driver.host", "127.0.0.1").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    check_slots(session, ranks, wait=60)


if __name__ == "__main__":
    main()
