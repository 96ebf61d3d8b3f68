"""The suite's check for a run's processes left behind: it names them by program or module."""

from __future__ import annotations

import subprocess
import time

import psutil

from .helpers import is_run_process, leftover_processes


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
