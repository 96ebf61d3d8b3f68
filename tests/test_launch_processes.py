"""Processes of a run: thread budget, exit statuses described, the stop escalation (real processes)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from hvd_magic import FailureClass
from hvd_magic.launch.processes import (
    death_of,
    family_of,
    spawn,
    stop_tree,
    thread_budget_env,
)
from hvd_magic.protocol.env import worker_command


def test_thread_budget_divides_cores_among_local_ranks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = thread_budget_env(local_ranks=2, cores=8, user_env={})
    assert env["OMP_NUM_THREADS"] == "4" and env["TF_NUM_INTRAOP_THREADS"] == "4"
    assert thread_budget_env(local_ranks=4, cores=2, user_env={})["OMP_NUM_THREADS"] == "1"
    assert thread_budget_env(local_ranks=2, cores=8, user_env={"OMP_NUM_THREADS": "3"}) == {}


def test_death_of_describes_signals_and_codes_with_their_class():
    assert death_of(1, -9, "vm").what.startswith("was killed by signal 9 (SIGKILL)")
    assert death_of(1, -9).failure is FailureClass.KILLED
    assert death_of(1, -15).what == "was killed by signal 15 (SIGTERM)"
    assert death_of(1, -11).failure is death_of(1, -6).failure is FailureClass.CRASH
    assert death_of(2, 3).what == "exited with code 3 without reporting"
    assert death_of(2, 3).failure is FailureClass.EXIT


def test_worker_command_runs_this_python():
    assert worker_command() == [sys.executable, "-m", "hvd_magic.rank.worker"]


STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print('ready', flush=True)\ntime.sleep(600)\n"
)


def test_stop_tree_escalates_to_sigkill_and_takes_the_descendants():
    process = spawn([sys.executable, "-c", STUBBORN], {"PATH": "/usr/bin:/bin"})
    assert process.stdout is not None and process.stdout.readline().strip() == b"ready"
    family = family_of(process)
    assert len(family) == 2  # the stubborn process and its child
    stop_tree(process)  # SIGINT and SIGTERM are ignored: only the SIGKILL step ends them
    process.wait(timeout=30)
    assert [member.pid for member in family if _alive(member)] == []


def test_a_reaped_process_whose_pid_names_another_is_not_stopped():
    """Pids wrap around (at 32768 by default): a launcher stopped after its process ended and
    was reaped must not stop whatever process has that pid now."""
    ended = spawn(["true"], {"PATH": "/usr/bin:/bin"})
    ended.wait(timeout=30)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        ended.pid = other.pid  # as if the kernel had handed the freed pid to this process
        assert family_of(ended) == []
        stop_tree(ended)
        assert other.poll() is None  # untouched
    finally:
        other.kill()
        other.wait(timeout=30)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_spawned_processes_die_with_the_thread_that_started_them():
    launcher = subprocess.Popen(
        [sys.executable, "-c", "from hvd_magic.launch.processes import spawn; import sys, time\n"
         "p = spawn([sys.executable, '-c', 'import time; time.sleep(600)'], {})\n"
         "print(p.pid, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert launcher.stdout is not None
    child = psutil.Process(int(launcher.stdout.readline()))
    launcher.kill()
    launcher.wait(timeout=30)
    child.wait(timeout=30)  # PR_SET_PDEATHSIG: SIGKILLed with its parent
    assert not child.is_running()
