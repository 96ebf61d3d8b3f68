"""How the suite's tests are shared between pytest-xdist's workers (``make test``: ``-n 3
--dist loadscope --no-loadscope-reorder``): in groups that each run on one worker, the longest
first.

A group is a test module (its module-scoped fixtures, a Spark cluster say, are made once), but
the example notebooks go one a group (they share nothing, and are the longest), the timeline
modules are one group (they share the session's recorded timelines), and so are the modules
that share a Spark cluster (``spark_fixtures.shared_spark_session``: made once for all of them,
stopped at the group's end), and the modules that mostly wait (``WAITING``). Longest first,
so that no worker is left with a long group at the end while the other has nothing to do; how
long each group took is kept in ``durations.json``, written anew by a run with
``HVD_MAGIC_RECORD_DURATIONS=1`` (a group it does not know counts as short).

The groups are xdist's scopes, named from the test ids by our own scheduler: xdist's own
``xdist_group`` marks do nothing under pytest 9 (xdist 3.8 renames ``item._nodeid``, which
pytest no longer reads).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

DURATIONS = Path(__file__).with_name("durations.json")
RECORD_VARIABLE = "HVD_MAGIC_RECORD_DURATIONS"
ONE_GROUP_EACH = ("test_examples",)  # each test a group of its own
SHARED = {"test_timeline_": "test_timeline"}  # modules named so share one group
# modules that share one Spark cluster (spark_fixtures.shared_spark_session), made once per group
SAME_CLUSTER = {
    "test_estimator_compat": "spark-two-executors",
    "test_spark_sessions": "spark-two-executors",  # last: it kills an executor
    "test_spark_estimators": "spark-two-executors",
    "test_data_spark": "spark-four-gpus",
    "test_distributor": "spark-four-gpus",
    "test_launch_spark": "spark-four-gpus",
}
# Modules that mostly wait (on a timeout, a stall or a rank held on purpose: under a third of a
# core on average) are one group, run one after another, and it starts first, beside the two
# Spark clusters' groups, whose JVMs and ranks use more than a core each: there its waits leave
# the cores to them. Two such modules at once left the cores idle (a fresh clone's run: 144 idle
# core-seconds, most of them where such modules met); the group beside smaller modules, which
# use less than a core each, still left 136.
WAITING = frozenset({
    "test_session", "test_stragglers_run", "test_faults_horovod", "test_debugger", "test_faults_torch",
    "test_stop", "test_failure_classes", "test_hub", "test_stalls", "test_horovod_waits",
    "test_launch_agent", "test_launch_processes",
})  # fmt: skip
WAITING_GROUP = "waiting"
UNKNOWN_SECONDS = 5.0


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    module = Path(path).stem
    if module in ONE_GROUP_EACH:
        return nodeid
    if module in SAME_CLUSTER:
        return SAME_CLUSTER[module]
    if module in WAITING:
        return WAITING_GROUP
    for prefix, group in SHARED.items():
        if module.startswith(prefix):
            return group
    return path


def known_seconds() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def still_exists(group: str) -> bool:
    """Whether a module of ``tests/`` still falls in ``group`` (by :func:`group_of`'s rules)."""
    tests = DURATIONS.parent
    if "::" in group:  # a test that is a group of its own: its module's still there
        return (tests.parent / group.split("::", 1)[0]).is_file()
    return any(group_of(f"{tests.name}/{path.name}") == group for path in tests.glob("test_*.py"))


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling, with our groups as the scopes."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    return GroupScheduling(config, log) if config.getvalue("dist") == "loadscope" else None


class LongestFirst:
    """Sorts the items by their group's known time, after pytest's own order (which keeps the
    tests that share a fixture's value together), the waiting modules' group first; each
    group's tests stay together, in the order pytest gave them."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        seconds = known_seconds()
        groups = [group_of(item.nodeid) for item in items]
        first_seen = {group: index for index, group in reversed(list(enumerate(groups)))}

        def key(index: int) -> tuple[bool, float, int, int]:
            group = groups[index]
            return group != WAITING_GROUP, -seconds.get(group, UNKNOWN_SECONDS), first_seen[group], index

        items[:] = [items[index] for index in sorted(range(len(items)), key=key)]


class DurationRecorder:
    """Adds up each group's test time as the reports come (on the controller: every worker's)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[group_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Groups this run did not reach keep their time (a partial run); a module since deleted or
        renamed loses its."""
        merged = known_seconds() | {group: round(value, 1) for group, value in self.seconds.items()}
        merged = {group: value for group, value in merged.items() if still_exists(group)}
        ordered = dict(sorted(merged.items(), key=lambda item: -item[1]))
        DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")


def configure(config: pytest.Config) -> None:
    config.pluginmanager.register(LongestFirst(), "hvd-magic-longest-first")
    if os.environ.get(RECORD_VARIABLE) == "1" and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "hvd-magic-durations")
