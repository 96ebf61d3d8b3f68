"""What every benchmark here measures with: the median (or the least) wall time of a warmed-up
call. The least is the better estimate of a cost when one run is subtracted from another on a
shared, noisy machine."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def wall_times(run: Callable[[], object], repeat: int) -> list[float]:
    run()  # warm-up: page cache, Spark's Python workers
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def median_seconds(run: Callable[[], object], repeat: int) -> float:
    return statistics.median(wall_times(run, repeat))


def least_seconds(run: Callable[[], object], repeat: int) -> float:
    return min(wall_times(run, repeat))


def in_turn(runs: dict[str, Callable[[], object]], repeat: int, warm_up: int = 1) -> dict[str, float]:
    """Each run's median seconds, the runs timed one after another in each of ``repeat`` rounds,
    after ``warm_up`` rounds untimed: drift in the machine's load falls on all of them alike, so
    their ratio is one of the same moment."""
    for _ in range(warm_up):
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


class QuietView:
    """A run's view that shows nothing: what a benchmark times is not the ranks' output."""

    def notice(self, text: str) -> None:
        pass

    def message(self, message: object) -> None:
        pass

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass
