"""How the suite's tests are shared between pytest-xdist's workers (``make test``: ``-n 2 --dist
loadgroup --no-loadscopereorder``): in groups that each run on one worker, the longest first.

A group is a test module (its module-scoped fixtures, a Spark cluster say, are made once), but
the example notebooks go one a group and Spark Connect's tests one group a server: they share
nothing, and are the longest. The timeline modules are one group: they share the session's
recorded timelines. Longest first, so that no worker is left with a long group at the end
while the other has nothing to do; how long each group took is kept in ``durations.json``,
written anew by a run with ``HVD_MAGIC_RECORD_DURATIONS=1`` (a group it does not know counts
as short).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
RECORD_VARIABLE = "HVD_MAGIC_RECORD_DURATIONS"
ONE_GROUP_EACH = ("test_examples",)  # each test a group of its own
GROUP_BY_PARAM = {"test_spark_connect": "connect"}  # a group per value of this fixture
SHARED = {"test_timeline_": "test_timeline"}  # modules named so share one group
UNKNOWN_SECONDS = 5.0


def group_of(item: pytest.Item) -> str:
    module = Path(str(item.fspath)).stem
    if module in ONE_GROUP_EACH:
        return f"{module}::{item.name}"
    if module in GROUP_BY_PARAM:
        params = getattr(getattr(item, "callspec", None), "params", {})
        return f"{module}[{params.get(GROUP_BY_PARAM[module], '')}]"
    for prefix, group in SHARED.items():
        if module.startswith(prefix):
            return group
    return module


def known_seconds() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))


class LongestFirst:
    """Sorts the items by their group's known time, after pytest's own order (which keeps the
    tests that share a fixture's value together) and xdist's renaming; each group's tests stay
    together, in the order pytest gave them."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        seconds = known_seconds()
        groups = [group_of(item) for item in items]
        first_seen = {group: index for index, group in reversed(list(enumerate(groups)))}
        order = sorted(
            range(len(items)),
            key=lambda i: (-seconds.get(groups[i], UNKNOWN_SECONDS), first_seen[groups[i]], i),
        )
        items[:] = [items[i] for i in order]


class DurationRecorder:
    """Adds up each group's test time as the reports come (on the controller: every worker's)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        group = report.nodeid.rpartition("@")[2] if "@" in report.nodeid else report.nodeid.split("::")[0]
        self.seconds[group] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):  # a worker: the controller writes the file
            return
        merged = known_seconds() | {group: round(value, 1) for group, value in self.seconds.items()}
        DURATIONS.write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(LongestFirst(), "hvd-magic-longest-first")
    if os.environ.get(RECORD_VARIABLE) == "1" and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "hvd-magic-durations")
