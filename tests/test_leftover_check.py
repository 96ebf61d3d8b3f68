"""The suite's check for a run's processes left behind: it names them by program or module."""

from __future__ import annotations

import os
import subprocess
import time

import psutil

from .helpers import (
    SUITE_VARIABLE,
    is_left_running,
    is_run_process,
    leftover_processes,
    run_processes_anywhere,
)


def test_run_processes_are_named_by_program_or_module_not_by_a_substring():
    assert is_run_process(["/usr/bin/mpirun", "-np", "2", "python"])
    assert is_run_process(["orted", "-mca", "ess", "env"])
    assert is_run_process(["/venv/bin/python", "-m", "hvd_magic.rank.worker"])
    assert is_run_process(
        ["/venv/bin/python", "-I", "/src/hvd_magic/warm/stand_in.py", "/tmp/hvd_magic-fork-x/socket"]
    )
    assert is_run_process(["python3", "-u", "-m", "hvd_magic.launch.task.agent", "hvd-host-1", "orted"])
    assert not is_run_process(["timeout", "900", "python", "-m", "pytest", "tests/test_launch_mpirun.py"])
    assert not is_run_process(["bash", "-c", "grep orted log"])
    assert not is_run_process(["python", "-m"])
    assert not is_run_process([])


def test_a_real_process_left_running_is_found_and_its_end_seen():
    """A live process that calls itself mpirun (exec -a) is a leftover until it is gone."""
    child = subprocess.Popen(["bash", "-c", "exec -a mpirun sleep 600"])
    try:
        deadline = time.monotonic() + 30  # until bash has exec'd: its argv[0] is then mpirun
        while not (found := leftover_processes(settle=0)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found and found[0].startswith(f"{child.pid}: mpirun"), found
        assert any(line.startswith(f"{child.pid}: mpirun") for line in run_processes_anywhere())
    finally:
        child.kill()
        child.wait()
    assert leftover_processes() == []


def test_a_process_on_its_way_out_is_not_left_behind():
    """One that ends within the settling time (a rank still exiting as its run returns: seen
    once under coverage.py, whose data file a rank writes as it exits) is no leftover; it is
    a zombie of this process once it has, still listed by the system until reaped."""
    child = subprocess.Popen(["bash", "-c", "exec -a mpirun sleep 1"])
    try:
        deadline = time.monotonic() + 30
        while not leftover_processes(settle=0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leftover_processes(settle=0), "the child never called itself mpirun"
        assert leftover_processes() == []  # it ended within the settling time
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE  # not reaped, yet not left
    finally:
        child.kill()
        child.wait()


class Changing:
    """A process as psutil shows one that changes while it is looked at: its command line and
    environment read, one call after another, as given (the last one then stays)."""

    pid = 4242

    def __init__(self, argvs: list[list[str]], environs: list[dict[str, str]]) -> None:
        self.argvs, self.environs = argvs, environs

    def cmdline(self) -> list[str]:
        return self.argvs.pop(0) if len(self.argvs) > 1 else self.argvs[0]

    def environ(self) -> dict[str, str]:
        return self.environs.pop(0) if len(self.environs) > 1 else self.environs[0]

    def parent(self) -> None:
        return None

    def status(self) -> str:
        return psutil.STATUS_RUNNING


MPIRUN = ["mpirun", "-np", "4", "python", "-m", "hvd_magic.rank.worker"]
RANK = ["python", "-m", "hvd_magic.rank.worker"]


def test_a_process_caught_in_its_exec_counts_as_it_stands_after():
    """A child of another suite's mpirun read in its exec shows mpirun's command line, then an
    empty environment (no mark: it would count as this suite's) and none: it is looked at again,
    and the rank it became is another suite's (seen once in CI: a one-shot check failed on it)."""
    another = {SUITE_VARIABLE: "another suite", "OMPI_COMM_WORLD_RANK": "3"}
    caught = Changing([MPIRUN, MPIRUN, [], RANK], [{}, another])
    assert not is_left_running(caught)  # type: ignore[arg-type]
    ours = Changing([MPIRUN, MPIRUN, [], RANK], [{}, another | {SUITE_VARIABLE: os.environ[SUITE_VARIABLE]}])
    assert is_left_running(ours)  # type: ignore[arg-type]


def test_a_process_whose_memory_is_gone_as_it_exits_is_not_left():
    exiting = Changing([MPIRUN, MPIRUN, []], [{}])
    assert not is_left_running(exiting)  # type: ignore[arg-type]


def test_a_process_without_a_mark_that_stands_still_counts():
    """One started outside any suite (no mark at all) is counted: it may be this suite's leftover."""
    assert is_left_running(Changing([MPIRUN], [{}]))  # type: ignore[arg-type]
