"""Where the suite's CPU goes, test module by test module (``HVD_MAGIC_CPU_PROFILE=1``; root).

The suite is bound by CPU on two cores, so a module's cost is the CPU that it and everything it
starts use: ranks, mpirun, Spark's JVMs and Python workers, kernels, browsers, the bed's hosts.
Each xdist worker moves itself into a cgroup of its own (cgroup v1's ``cpuacct``), which every
process it starts inherits, however far it is reparented; the group's CPU is read as each test's
setup, call and teardown ends, and the test's sum is kept on its teardown report (``cpu_s`` in
its user properties, which pytest's ``--junitxml`` file takes from that report), with the worker
that ran it and when it ended (``worker``, ``ended``: what ran beside what). The controller
adds them up by module and prints the table at the end of the run.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

VARIABLE = "HVD_MAGIC_CPU_PROFILE"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
KEY = "cpu_s"


class CpuMeter:
    """On a worker: its cgroup's CPU time, read as each phase of a test ends; the test's whole
    figure goes on its teardown report (the one pytest's JUnit file takes properties from)."""

    def __init__(self, group: Path, home: str, worker: str) -> None:
        self.group, self.home, self.worker = group, home, worker
        self.last = self.seconds()
        self.test = 0.0  # the running test's CPU so far

    @classmethod
    def start(cls, worker: str) -> CpuMeter | None:
        """This process (xdist's ``worker``) in a new cgroup of its own; None where cgroup v1's
        cpuacct is not writable."""
        group = CPUACCT / f"hvd_magic-suite-{os.getpid()}-{worker}"
        try:
            home = next(
                line.split(":", 2)[2]
                for line in Path("/proc/self/cgroup").read_text().splitlines()
                if line.split(":")[1] == "cpuacct"
            )
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except (OSError, StopIteration) as err:
            warnings.warn(
                f"{VARIABLE}: no cpuacct cgroup to measure in ({err}); nothing measured", stacklevel=1
            )
            return None
        return cls(group, home, worker)

    def seconds(self) -> float:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.last = self.seconds()  # collection is no test's

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[Any]:
        outcome = yield
        now = self.seconds()
        self.test, self.last = self.test + now - self.last, now
        if call.when == "teardown":
            properties = outcome.get_result().user_properties
            properties.append((KEY, round(self.test, 2)))
            # where and when it ended: each worker's timeline, to see what ran beside what
            properties += [("worker", self.worker), ("ended", round(time.time(), 1))]
            self.test = 0.0

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Back to the group it came from, and its own removed (kept while a process is left in it)."""
        with contextlib.suppress(OSError):
            (CPUACCT / self.home.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()


class CpuTable:
    """On the controller: CPU-seconds by test module, from every worker's reports."""

    def __init__(self) -> None:
        self.by_module: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = Path(report.nodeid.split("::", 1)[0]).stem
        self.by_module[module] += sum(value for key, value in report.user_properties if key == KEY)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        total = sum(self.by_module.values())
        terminalreporter.write_sep("=", f"CPU-seconds by test module ({total:,.0f} in all)")
        for module, seconds in sorted(self.by_module.items(), key=lambda item: -item[1]):
            share = 100 * seconds / max(total, 1e-9)
            terminalreporter.write_line(f"{seconds:9,.0f}  {share:5.1f} %  {module}")


def configure(config: pytest.Config) -> None:
    """With ``HVD_MAGIC_CPU_PROFILE=1``: a meter where tests run (each xdist worker, or pytest
    itself without xdist), the table where reports come together (xdist's controller, or pytest)."""
    if os.environ.get(VARIABLE) != "1":
        return
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is not None or not config.getoption("numprocesses", None):
        meter = CpuMeter.start(worker or "main")
        if meter is not None:
            config.pluginmanager.register(meter, "hvd-magic-cpu-meter")
    if worker is None:
        config.pluginmanager.register(CpuTable(), "hvd-magic-cpu-table")
