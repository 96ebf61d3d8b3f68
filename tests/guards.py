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
        within = figure >= self.limit if self.higher_is_better else figure <= self.limit
        assert within, f"past the guard: {line}"
