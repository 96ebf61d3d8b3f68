"""An epoch's metrics on a rank and over the ranks: batches add their mean and rows, and one
allreduce turns every rank's sums into means weighted by rows (a rank with fewer validation
rows counts for less). Names come from the spec, not the data, so every rank reduces the same
ones even when it has no rows for some."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Averages"]


class Averages:
    """Per-name means over rows, in the order the names were declared."""

    def __init__(self, names: Iterable[str]) -> None:
        self.sums = dict.fromkeys(names, 0.0)
        self.rows = dict.fromkeys(self.sums, 0)

    def add(self, name: str, mean: float, rows: int) -> None:
        self.sums[name] += float(mean) * rows
        self.rows[name] += rows

    def local(self) -> dict[str, float]:
        return {name: self.sums[name] / count for name, count in self.rows.items() if count}

    def reduce(self, allreduce_sum: Callable[[Any], Any]) -> dict[str, float]:
        """The means over all ranks' rows (``allreduce_sum``: a float64 numpy vector summed over
        the ranks); a name no rank had rows for is left out."""
        import numpy

        names = list(self.sums)
        local = [*(self.sums[name] for name in names), *(self.rows[name] for name in names)]
        totals = numpy.asarray(allreduce_sum(numpy.asarray(local, dtype=numpy.float64)))
        count = len(names)
        return {
            name: float(totals[i] / totals[count + i]) for i, name in enumerate(names) if totals[count + i]
        }
