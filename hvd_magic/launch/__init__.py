"""Launchers start the ranks of one run and stop them; they know nothing of widgets.

``LaunchPlan`` is plain data; each launcher turns it into processes. ``Launcher`` is the small
interface the engine drives: ``start``, ``poll``, ``stop``, ``diagnostics``, ``deaths``.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LaunchPlan",
    "Launcher",
    "RankDeath",
    "death_of",
    "die_with_parent",
    "mpirun_deaths",
    "spawn",
    "thread_budget_env",
]

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")


@dataclass
class LaunchPlan:
    """What to run: ``np`` ranks of ``command`` with ``env`` added to the environment."""

    np: int
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = field(default_factory=os.getcwd)
    launcher: str = "mpi"  # "mpi" or "gloo"


def thread_budget_env(local_ranks: int, cores: int, user_env: dict[str, str]) -> dict[str, str]:
    """CPU threads per rank = cores / ranks on the host, unless the user chose a number.

    Without it every rank starts one intra-op thread per core and N ranks on N cores
    oversubscribe: a small torch script ran ~4x slower here.
    """
    if any(var in user_env or var in os.environ for var in THREAD_VARS):
        return {}
    threads = str(max(1, cores // max(1, local_ranks)))
    return {var: threads for var in THREAD_VARS} | {"TF_NUM_INTEROP_THREADS": "1"}


_prctl: Any
try:
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl  # resolved now, not in a forked child
except (OSError, AttributeError):
    _prctl = None
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (PR_SET_PDEATHSIG).

    Also the ``preexec_fn`` of ``spawn``: every process of a run (ranks, mpirun, orted,
    rsh clients) dies with whatever launched it, the notebook's kernel included.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    argv: list[str], env: dict[str, str], *, cwd: str | None = None, stderr: int = subprocess.STDOUT
) -> subprocess.Popen[bytes]:
    """Start one process of a run, output piped (stderr into stdout unless told otherwise).

    It gets its own session, so the notebook's Ctrl-C reaches the launcher, which stops the
    processes in order; and it is SIGKILLed when the thread that started it ends, so a dead
    kernel, Spark task or agent leaves nothing running.
    """
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


@dataclass(frozen=True)
class RankDeath:
    """A rank that ended without a word (no error, no exit event), as its launcher saw it."""

    rank: int
    what: str  # "was killed by signal 9 (SIGKILL)", ...
    host: str = ""


def death_of(rank: int, code: int, host: str = "") -> RankDeath:
    """Describe a rank process's exit status (Popen's: negative for a signal)."""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else "?"
        what = f"was killed by signal {-code} ({name})"
        if -code == signal.SIGKILL:
            what += ", e.g. by the kernel's out-of-memory killer"
        return RankDeath(rank, what, host)
    return RankDeath(rank, f"exited with code {code} without reporting", host)


_MPIRUN_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on\s+node (\S+) exited on signal (\d+)")
_MPIRUN_IMPROPER = re.compile(r"process rank (\d+) with PID \d+ on\s+node (\S+) exiting improperly")
_MPIRUN_CODE = re.compile(
    r"The first process to do so was:\s+Process name:\s+\[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)"
)


def mpirun_deaths(output: str) -> list[RankDeath]:
    """The rank mpirun saw end first, from its own report (Open MPI 4); [] if it reported none."""
    if found := _MPIRUN_SIGNAL.search(output):
        return [death_of(int(found[1]), -int(found[3]), found[2])]
    if found := _MPIRUN_IMPROPER.search(output):
        what = "exited without shutting down (os._exit, or a crash outside Python)"
        return [RankDeath(int(found[1]), what, found[2])]
    if found := _MPIRUN_CODE.search(output):
        return [death_of(int(found[1]), int(found[2]))]
    return []


class Launcher:
    """Interface of a launcher (see launch.local for the implementations)."""

    def start(self) -> None:
        raise NotImplementedError

    def poll(self) -> int | None:
        """The job's exit code once every process ended, else None."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop every process of the job: SIGINT, then SIGTERM, then SIGKILL."""
        raise NotImplementedError

    def diagnostics(self) -> str:
        """The launcher's own output (e.g. mpirun's error block), bounded."""
        return ""

    def deaths(self) -> list[RankDeath]:
        """Ranks seen to end badly, in the order seen, where the launcher can tell (some of
        them may have reported an error before they ended)."""
        return []
