"""Where a cold cell's time goes on Spark, against the same cell here (issue 77, item 4).

A trivial allreduce, np=2, on the embedded local Spark (warm) and locally (np=-2), traced from the
notebook: the moments the run starts its launcher, the barrier stage's tasks join, the ranks
start, end, and the launcher (or the Spark job) ends, and the run returns. Printed: each phase's
median over ``--repeat`` runs of each, in turn. The phases:

- ``stage``: the launcher started -> every task joined (Spark schedules the barrier stage, each
  task starts in a Python worker Spark kept, finds its executor's fork server);
- ``ranks start``: the plan sent (locally: the launch) -> every rank said it started;
- ``work``: -> every rank said its exit (Horovod's init, the allreduce, the value);
- ``ranks end``: -> the launcher ended (the ranks' processes exit; on Spark, their tasks say so);
- ``tasks end``: -> every task confirmed that what it started is gone (Spark only: the run is
  over then, and Spark ends the job while the notebook goes on);
- ``close``: -> the run returned (stop, the hub closed).

Usage: python bench/spark_phases.py [--repeat 5] [--launcher gloo]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from figures import keep
from launch import cold_cell

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

PHASES = ("stage", "ranks start", "work", "ranks end", "tasks end", "close")


class Trace:
    """The first time each moment of a run was reached (perf_counter), from wrapped methods."""

    def __init__(self) -> None:
        self.moments: dict[str, float] = {}

    def mark(self, moment: str, again: bool = False) -> None:
        if again or moment not in self.moments:
            self.moments[moment] = time.perf_counter()

    def phases(self, began: float, ended: float) -> dict[str, float]:
        at = self.moments
        plan = at.get("plan", at.get("launched", began))
        points = [
            ("stage", began, plan),
            ("ranks start", plan, at["started"]),
            ("work", at["started"], at["exited"]),
            ("ranks end", at["exited"], at["launcher ended"]),
            ("tasks end", at["launcher ended"], at.get("tasks ended", at["launcher ended"])),
            ("close", at.get("tasks ended", at["launcher ended"]), ended),
        ]
        return {name: end - start for name, start, end in points}


def traced(trace: Trace) -> None:
    """Wrap the moments' methods (the notebook side only: the ranks and tasks run unchanged)."""
    from hvd_magic.launch.spark import SparkLauncher
    from hvd_magic.run.record import RunRecord
    from hvd_magic.run.supervisor import Run

    def after(owner: Any, name: str, then: Callable[[Any, Any], None]) -> None:
        real = getattr(owner, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = real(self, *args, **kwargs)
            then(self, result)
            return result

        setattr(owner, name, wrapper)

    after(SparkLauncher, "_send_plan", lambda launcher, _: trace.mark("plan"))
    after(SparkLauncher, "release", lambda launcher, _: trace.mark("launcher ended"))

    def applied(record: Any, _: Any) -> None:
        if len(record.started) == record.ranks:
            trace.mark("started")
        if len(record.exited) == record.ranks:
            trace.mark("exited")

    after(RunRecord, "apply", applied)

    def polled(run: Any, _: Any) -> None:
        code = run.launcher.poll()
        if code is not None:
            trace.mark("tasks ended" if isinstance(run.launcher, SparkLauncher) else "launcher ended")

    after(Run, "_beat", polled)


def empty_stage(session: Any) -> float:
    """Seconds to build and collect a barrier stage of 2 tasks that do nothing."""
    began = time.perf_counter()
    session.range(0, 2, 1, 2).mapInArrow(_nothing, "code long", barrier=True).collect()
    return time.perf_counter() - began


def _nothing(batches: Any) -> Any:
    import pyarrow as pa

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"code": [0]}, schema=pa.schema([("code", pa.int64())]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--launcher", default="gloo", choices=["gloo", "mpi"])
    args = parser.parse_args()
    from hvd_magic.launch.embedded_spark import active_or_embedded_session

    session = active_or_embedded_session()
    trace = Trace()
    traced(trace)
    runs = {"spark": cold_cell(2, args.launcher), "local": cold_cell(-2, args.launcher)}
    for _ in range(3):  # warm: Spark's Python workers, the fork servers, the JVM's first jobs
        for run in runs.values():
            run()
    empty = statistics.median(empty_stage(session) for _ in range(args.repeat))
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    totals: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, run in runs.items():
            trace.moments = {}
            began = time.perf_counter()
            run()
            ended = time.perf_counter()
            totals[name].append(ended - began)
            phases[name].append(trace.phases(began, ended))
    session.stop()

    def median(name: str, phase: str) -> float:
        return statistics.median(run[phase] for run in phases[name])

    spark, local = (statistics.median(totals[name]) for name in runs)
    print(f"a cold cell's phases, np=2, {args.launcher}, medians of {args.repeat}, {os.cpu_count()} cores")
    print(f"  {'phase':12s} {'Spark':>8s} {'local':>8s}")
    for phase in PHASES:
        print(f"  {phase:12s} {1e3 * median('spark', phase):6.0f} ms {1e3 * median('local', phase):6.0f} ms")
    ratio = spark / local
    print(f"  {'in all':12s} {1e3 * spark:6.0f} ms {1e3 * local:6.0f} ms   Spark {ratio:.2f}x local (<= 1.3)")
    print(f"  an empty barrier stage of 2 tasks, built and collected: {1e3 * empty:.0f} ms (Spark's floor)")
    figures = {}
    for name, phase in itertools.product(runs, PHASES):
        figures[f"{name}_{phase.replace(' ', '_')}"] = f"{1e3 * median(name, phase):.0f} ms"
    figures |= {"spark": f"{spark:.2f} s", "local": f"{local:.2f} s", "ratio": f"{ratio:.2f}x"}
    figures["empty_stage"] = f"{1e3 * empty:.0f} ms"
    keep(f"spark_phases_{args.launcher}", figures)


if __name__ == "__main__":
    main()
