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
