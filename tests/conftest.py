from __future__ import annotations

import gc
import os
import signal
import uuid
from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

from . import cpu_profile, guards, scheduling, spark_fixtures, spark_jvm
from .helpers import (
    SUITE_VARIABLE,
    end_of_test,
    leftover_processes,
    sigint_in_tests,
    start_of_test,
)
from .multihost import multihost  # noqa: F401 - the multi-host bed's fixture, for any test module

# This suite's mark, inherited by every process it starts (Spark's workers and executors, ranks,
# the bed's hosts), so that the checks for processes left behind skip another suite's.
os.environ[SUITE_VARIABLE] = uuid.uuid4().hex
# The suite's Spark JVMs are small, short-lived and share an archive of classes (spark_jvm).
os.environ.pop("SPARK_CONF_DIR", None)
os.environ.update(spark_jvm.environment())


pytest_xdist_make_scheduler = scheduling.pytest_xdist_make_scheduler  # xdist's groups: ours


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The Spark cluster a group's modules share ends with the group, after its modules'
    fixtures, even where their teardown failed: a later module must not find it active."""
    try:
        return (yield)
    finally:
        if nextitem is None or scheduling.group_of(nextitem.nodeid) != scheduling.group_of(item.nodeid):
            spark_fixtures.stop_shared()


def pytest_sessionfinish() -> None:
    spark_fixtures.stop_shared()  # a run stopped early (-x) ends in no group's last test


def pytest_configure(config: pytest.Config) -> None:
    scheduling.configure(config)
    cpu_profile.configure(config)


@pytest.fixture(scope="session", autouse=True)
def _interrupts_reach_python() -> None:
    """Tests interrupt runs with SIGINT as a notebook's stop button does: a KeyboardInterrupt,
    as a kernel's handler raises it, also where the shell that started the suite in the
    background made it ignore SIGINT; dropped between tests (``sigint_in_tests``)."""
    signal.signal(signal.SIGINT, sigint_in_tests)


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    """The shell, reset after the test. A worker's heap holds torch's, TensorFlow's and Spark's
    objects (600,000 and more), which the reset's ``gc.collect()`` walked at every teardown (0.4
    CPU-s and more each time: 200 CPU-s of the suite's pytest workers, py-spy showed): what is
    alive as the test starts is frozen (``gc.freeze``, after collecting what is garbage by then),
    so that each collection walks only what came after."""
    gc.collect()
    gc.freeze()
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext hvd_magic")
    yield shell
    shell.reset()
    assert leftover_processes() == []


@pytest.fixture(autouse=True)
def _actions_end_with_their_test() -> Iterator[None]:
    """An action waiting for a test's ranks (``when_started``) never fires into the next test,
    nor its stop into a teardown."""
    start_of_test()
    yield
    end_of_test()


@pytest.fixture(autouse=True)
def _no_thread_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests check the budget the launcher sets; a developer's OMP_NUM_THREADS would hide it.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        monkeypatch.delenv(var, raising=False)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The guards' figures (``tests/guards.py``), passed or failed, from every worker."""
    lines = [
        value
        for key in ("passed", "failed")
        for report in terminalreporter.stats.get(key, [])
        for name, value in getattr(report, "user_properties", [])
        if name == guards.PROPERTY and report.when == "call"
    ]
    if lines:
        terminalreporter.write_sep("-", "benchmark guards (tests/guards.py)")
        for line in sorted(lines):
            terminalreporter.write_line(line)
