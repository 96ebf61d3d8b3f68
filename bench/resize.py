"""Elastic benchmark (issue 43): what a host's loss and its return cost a ``min_np=`` run.

A real Spark standalone cluster on this machine: a master and two workers of one core each, on
their own loopback addresses (127.0.0.2, 127.0.0.3). The run is ``np=2 min_np=1 retries=2
resize_wait=2`` with a checkpoint every 10 steps (a step: one allreduce, 50 ms of work). Each
repetition:

1. once the run has kept its step-10 checkpoint, the worker on 127.0.0.3 is killed with
   everything under it (its executor, its rank), as a host that goes;
2. the run goes on with one rank from its last checkpoint: the figure "a host lost to training
   on fewer" is the kill to that attempt's first step (resize_wait, 2 s here, is part of it);
3. the worker is started again: "a host's return to the run at full size" is the worker's start
   to the first step of the attempt at np=2, split into Spark's part (the worker's start to the
   application having both slots again: the worker registers, the master gives the application an
   executor) and hvd_magic's (both slots there to the first step at full size: the smaller run's
   next checkpoint, its stop, the relaunch, Horovod's start, the resume).

The figures are kept for the docs (``figures.py``).

Usage: python bench/resize.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from figures import keep

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.spark_fixtures import Standalone, spark_session  # noqa: E402

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

CELL = """
import pathlib, time, horovod.torch as hvd, torch, hvd_magic
hvd.init()
marks = pathlib.Path({marks!r})
state = hvd_magic.resume() or {{"step": 0}}
start = state["step"]
end = start + 20 if hvd_magic.resized() == (1, 2) else 100000  # at full size again: 20 more steps
for step in range(start, end):
    hvd.allreduce(torch.ones(1))
    if step == start and hvd.rank() == 0:
        (marks / f"first-{{hvd.size()}}-{{start}}").write_text(repr(time.time()))
    if step % 10 == 9:
        hvd_magic.checkpoint({{"step": step + 1}}, step=step + 1)
    time.sleep(0.05)
"""


def _wait(found: Callable[[], Any], what: str, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := found()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.02)
    return value


def _first_step(marks: Path, size: int, after: int = -1) -> float | None:
    for path in marks.glob(f"first-{size}-*"):
        if int(path.name.rsplit("-", 1)[1]) > after:
            return float(path.read_text())
    return None


def one_run(shell: Any, cluster: Standalone, session: Any) -> tuple[float, float, float]:
    """(a host lost to training on fewer, the worker's start to both slots back, both slots
    back to the first step at full size), in seconds."""
    from hvd_magic.launch.spark_session import slots_available
    from hvd_magic.protocol.files import checkpoint_name

    with tempfile.TemporaryDirectory() as folder:
        marks, store, times = Path(folder), Path(folder) / "store", dict[str, float]()

        def lose_then_return() -> None:
            _wait(lambda: (store / checkpoint_name(10)).exists(), "the step-10 checkpoint")
            times["lost"] = time.time()
            cluster.lose_worker("127.0.0.3")
            _wait(lambda: _first_step(marks, 1), "the smaller attempt's first step")
            times["returned"] = time.time()
            cluster.start_worker("127.0.0.3")
            _wait(lambda: (slots_available(session) or 0) >= 2, "both slots back")
            times["slots"] = time.time()

        actor = threading.Thread(target=lose_then_return, daemon=True)
        actor.start()
        cell = CELL.format(marks=folder)
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            shell.run_cell_magic(
                "horovod", f"np=2 min_np=1 retries=2 resize_wait=2 checkpoint_dir={store}", cell
            )
        actor.join(timeout=60)
        smaller = _first_step(marks, 1)
        full = _first_step(marks, 2, after=0)
        if smaller is None or full is None or "slots" not in times:
            raise RuntimeError(
                f"the run was not resized both ways: {sorted(p.name for p in marks.iterdir())}"
            )
        return smaller - times["lost"], times["slots"] - times["returned"], full - times["slots"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from IPython.testing.globalipapp import start_ipython

    from hvd_magic.launch.spark_session import check_slots

    conf = {"spark.executor.cores": "1", "spark.cores.max": "2", "spark.executor.memory": "1g"}
    with tempfile.TemporaryDirectory() as logs:
        cluster = Standalone(["127.0.0.2", "127.0.0.3"], cores=1, log_dir=Path(logs))
        try:
            cluster.start()
            with spark_session(cluster.url, conf) as session:
                check_slots(session, 2, wait=60)
                shell = start_ipython()
                shell.run_line_magic("load_ext", "hvd_magic")
                runs = [one_run(shell, cluster, session) for _ in range(args.repeat)]
        finally:
            cluster.stop()
    fewer, spark, ours = (statistics.median(figures) for figures in zip(*runs, strict=True))
    print(f"elastic runs: np=2 min_np=1, standalone Spark, medians of {args.repeat}, {os.cpu_count()} cores")
    print(f"  a host lost to training on fewer (resize_wait=2)   {fewer:6.2f} s")
    print(f"  a host's return to the run at full size           {spark + ours:6.2f} s")
    print(f"    Spark: the worker's start to both slots there    {spark:6.2f} s")
    print(f"    hvd_magic: both slots to training at np=2        {ours:6.2f} s")
    figures = {"fewer": fewer, "back": spark + ours, "spark": spark, "ours": ours}
    keep("resize", {name: f"{seconds:.2f} s" for name, seconds in figures.items()})


if __name__ == "__main__":
    main()
