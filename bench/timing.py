"""What every benchmark here measures with: the median wall time of a warmed-up call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(run: Callable[[], object], repeat: int) -> float:
    run()  # warm-up: page cache, Spark's Python workers
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)
