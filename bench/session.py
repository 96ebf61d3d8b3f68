"""Live session benchmark: a cell on live ranks against ipyparallel's ``%%px`` and a cold cell.

All through IPython's magics in one shell, np=2 on this machine, measured in the same run:

- ``%%px 1`` on 2 ipyparallel engines (the mark: its cell on live engines);
- ``%%horovod`` ``1`` on a live session (``%horovod start np=-2``), and a cell that reads a tensor
  an earlier cell made (``w.item()``);
- the cold cell that does the same work: ``%%horovod np=-2`` importing horovod.torch, ``hvd.init()``,
  making the tensor and reading it.

Targets: the live trivial cell at most 0.25x ``%%px`` (issue 77; 27 asked 2x), locally and on
Spark; the live cell that reads a tensor >= 50x faster than the cold one. The figures are kept
for the docs (``figures.py``). With ``--spark``, the live cells also on a
session on the embedded local Spark (np=2): once started, Spark is not on a cell's path.

Usage: python bench/session.py [--repeat 50] [--spark]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from collections.abc import Callable

from figures import keep

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

COLD = "import horovod.torch as hvd, torch\nhvd.init()\nw = torch.tensor([hvd.rank() + 1.0])\nw.item()"


def p50_ms(run: Callable[[], object], repeat: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def px_ms(shell: object, repeat: int) -> float:
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=2, log_level=40)
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(2, timeout=120)
        view = client[:]
        view.block = True  # %%px waits for the engines' results, as a user sees it
        view.activate()  # registers %%px on this shell
        cell = shell.run_cell_magic  # type: ignore[attr-defined]
        with contextlib.redirect_stdout(io.StringIO()):
            return p50_ms(lambda: cell("px", "", "1"), repeat)
    finally:
        cluster.stop_cluster_sync()


def live_ms(shell: object, np: int, repeat: int) -> tuple[float, float]:
    magic, cell = shell.run_line_magic, shell.run_cell_magic  # type: ignore[attr-defined]
    with contextlib.redirect_stderr(io.StringIO()):
        magic("horovod", f"start np={np}")
    try:
        cell("horovod", "", "import torch\nw = torch.tensor([hvd.rank() + 1.0])")
        trivial = p50_ms(lambda: cell("horovod", "", "1"), repeat)
        reads = p50_ms(lambda: cell("horovod", "", "w.item()"), repeat)
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            magic("horovod", "stop")
    return trivial, reads


def live_against_cold(shell: object, np: int, repeat: int, cold_repeat: int) -> tuple[float, float]:
    """A live session's trivial cell and a cold ``%%horovod np=...`` cell of the same ``1``, p50 ms,
    measured in turn in this shell (the suite's guards: the two in one run)."""
    trivial, _ = live_ms(shell, np, repeat)
    cold = p50_ms(lambda: shell.run_cell_magic("horovod", f"np={np}", "1"), cold_repeat)  # type: ignore[attr-defined]
    return trivial, cold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--spark", action="store_true", help="also a session on the embedded local Spark")
    args = parser.parse_args()

    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "hvd_magic")
    px = px_ms(shell, args.repeat)
    trivial, reads = live_ms(shell, -2, args.repeat)
    cold = p50_ms(lambda: shell.run_cell_magic("horovod", "np=-2", COLD), max(3, args.repeat // 10))
    print(f"live session benchmark: np=2, p50 of {args.repeat}, {os.cpu_count()} cores")
    print(f"  %%px 1 (ipyparallel, 2 engines)            {px:8.1f} ms")
    print(
        f"  %%horovod 1, live session (local)          {trivial:8.1f} ms   {trivial / px:.2f}x %%px (<= 0.25)"
    )
    print(f"  %%horovod w.item(), live session (local)   {reads:8.1f} ms")
    speedup = cold / reads
    print(f"  cold %%horovod np=-2: init, make w, read    {cold:8.1f} ms   {speedup:.0f}x live (>= 50)")
    figures = {
        "px": f"{px:.1f} ms",
        "live_local": f"{trivial:.1f} ms",
        "live_local_px": f"{trivial / px:.2f}x",
        "reads_local": f"{reads:.1f} ms",
        "cold": f"{cold / 1000:.2f} s",
    }
    if args.spark:
        from hvd_magic.launch.embedded_spark import active_or_embedded_session

        session = active_or_embedded_session()
        spark_trivial, spark_reads = live_ms(shell, 2, args.repeat)
        ratio = spark_trivial / px
        line = f"  %%horovod 1, live session (Spark)          {spark_trivial:8.1f} ms"
        print(f"{line}   {ratio:.2f}x %%px (<= 0.25)")
        print(f"  %%horovod w.item(), live session (Spark)   {spark_reads:8.1f} ms")
        figures |= {"live_spark": f"{spark_trivial:.1f} ms", "live_spark_px": f"{ratio:.2f}x"}
        session.stop()
    keep("session", figures)


if __name__ == "__main__":
    main()
