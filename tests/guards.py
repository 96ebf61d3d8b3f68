"""What the guards on the headline benchmarks share (``tests/test_guards.py``, and the Spark one
in ``tests/test_launch_spark.py``): the benchmarks' own code, and one way to judge and print a
figure.

A guard runs its benchmark in a quick mode inside ``make test`` and compares figures measured in
the same run (never a figure against a fixed time), so that a loaded machine moves both sides;
it fails past a limit about 3x the benchmark's goal: a regression like issue 77's (a live cell
28x slower) trips it, a busy machine does not. ``pytest -k guard`` runs them all; each figure
is printed in the summary of the run (``conftest.pytest_terminal_summary``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
PROPERTY = "guard"


def bench(name: str) -> ModuleType:
    """A benchmark's module (``bench/NAME.py``), imported as its script imports its neighbours."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    return importlib.import_module(name)


@dataclass(frozen=True)
class Guard:
    """A figure's goal (the benchmark's target) and the guard's limit, about 3x as loose."""

    what: str
    goal: float
    limit: float
    higher_is_better: bool = False

    def judge(self, figure: float, record: pytest.RecordProperty, detail: str = "") -> None:
        """Print ``figure`` in the run's summary, then fail if it is past the limit."""
        sense = ">=" if self.higher_is_better else "<="
        line = f"{self.what}: {figure:.3g} (goal {sense} {self.goal:g}, guard {sense} {self.limit:g}){detail}"
        record(PROPERTY, line)
        print(line)
        assert self.within(figure), f"past the guard: {line}"

    def within(self, figure: float) -> bool:
        return figure >= self.limit if self.higher_is_better else figure <= self.limit

    def judge_best(
        self, measure: Callable[[], tuple[float, str]], record: pytest.RecordProperty, tries: int = 3
    ) -> None:
        """The best of up to ``tries`` measurements (``measure``: a figure and its detail), each
        made anew only once the last was past the limit: a moment of the machine's other work
        moves one measurement of a cost of microseconds (once in a full run: 8.5 % where others gave
        0 to 0.5 %), a regression moves every one. Each figure measured is printed."""
        figures = [measure()]
        while not self.within(figures[-1][0]) and len(figures) < tries:
            print(f"{self.what}: {figures[-1][0]:.3g}{figures[-1][1]}: past the guard, measured again")
            figures.append(measure())
        best = max(figures) if self.higher_is_better else min(figures)
        tried = f" (best of {len(figures)})" if len(figures) > 1 else ""
        self.judge(best[0], record, best[1] + tried)
