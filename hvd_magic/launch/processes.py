"""The processes of a run: how they start (parent-death signal, own session), how they stop
(SIGINT → SIGTERM → SIGKILL, descendants included), their CPU thread budget, and what their
end says (``RankDeath``)."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

import psutil

from hvd_magic.errors import FailureClass, class_of_signal
from hvd_magic.launch.memory_cgroup import MemoryWatch
from hvd_magic.protocol.env import THREAD_VARS
from hvd_magic.protocol.lifetime import die_with_parent

__all__ = [
    "OutputTail",
    "RankDeath",
    "death_of",
    "describe",
    "family_of",
    "stop_and_confirm",
    "spawn",
    "stop_processes",
    "stop_tree",
    "thread_budget_env",
]

STOP_GRACE_SECONDS = 1.5
GONE_SECONDS = 15.0  # after SIGKILL, how long to wait for the kernel to tear a process down
_TAIL_LINES = 200


def thread_budget_env(local_ranks: int, cores: int, user_env: dict[str, str]) -> dict[str, str]:
    """CPU threads per rank = cores / ranks on the host, unless the user chose a number.

    Without it every rank starts one intra-op thread per core and N ranks on N cores
    oversubscribe: a small torch script ran ~4x slower here.
    """
    if any(var in user_env or var in os.environ for var in THREAD_VARS):
        return {}
    threads = str(max(1, cores // max(1, local_ranks)))
    return {var: threads for var in THREAD_VARS} | {"TF_NUM_INTEROP_THREADS": "1"}


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


def stop_processes(processes: list[psutil.Process], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGINT, then SIGTERM, then SIGKILL, waiting up to ``grace`` seconds between steps."""
    alive = [p for p in processes if _alive(p)]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        for process in alive:
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        alive = _wait_gone(alive, grace)
        if not alive:
            return


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a zombie holds nothing but its pid; its parent reaps it)."""
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def describe(process: psutil.Process) -> str:
    """'1234: mpirun -np 4 ...' for error messages."""
    try:
        return f"{process.pid}: {' '.join(process.cmdline())[:120]}"
    except psutil.Error:
        return f"{process.pid}: ?"


def stop_and_confirm(
    processes: list[psutil.Process], grace: float = STOP_GRACE_SECONDS, bound: float = GONE_SECONDS
) -> list[psutil.Process]:
    """Stop ``processes`` (see ``stop_processes``) and wait until each is really gone; returns
    those still alive after ``bound`` more seconds (empty: the stop is complete)."""
    stop_processes(processes, grace)
    return _wait_gone(processes, bound)


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (alive := [p for p in processes if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


def family_of(process: subprocess.Popen[Any]) -> list[psutil.Process]:
    """A process we started and all its descendants ([] if it is gone). Once reaped, its pid
    may name another process (pids wrap around at 32768 by default): that one is never taken.
    The handle is taken before the check, so it names ours; psutil then refuses to signal it
    or list its children if the pid is reused later."""
    try:
        parent = psutil.Process(process.pid)
        if process.returncode is not None:  # reaped before the handle was taken
            return []
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_tree(process: subprocess.Popen[Any]) -> None:
    """Stop a process we started and all its descendants (see ``stop_processes``)."""
    stop_processes(family_of(process))


class OutputTail:
    """Reads a process's output on a thread and keeps the last lines for error messages."""

    def __init__(self, stream: IO[bytes] | None) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    def text(self) -> str:
        self._thread.join(timeout=1)
        return "\n".join(self.lines)


@dataclass(frozen=True)
class RankDeath:
    """A rank that ended without a word (no error, no exit event), as its launcher saw it."""

    rank: int
    what: str  # "was killed by signal 9 (SIGKILL) from outside the run", ...
    host: str = ""
    host_lost: bool = False  # its whole host went (the launcher stopped the others itself)
    failure: FailureClass = FailureClass.EXIT

    def said(self, host: str = "") -> str:
        """'rank 1 on hostB was killed by signal 9 (SIGKILL)': ``host``, else the launcher's."""
        where = host or self.host
        return f"rank {self.rank}{f' on {where}' if where else ''} {self.what}"


def _signal_name(number: int) -> str:
    """'SIGKILL'; a real-time signal's 'SIGRTMIN+6' (signal.Signals names only the first and last)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN < number < signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return "?"


def death_of(rank: int, code: int, host: str = "", memory: MemoryWatch | None = None) -> RankDeath:
    """Describe a rank process's exit status (Popen's: negative for a signal); ``memory`` is the
    watch of its memory cgroup, taken when it started (None where it could not be read)."""
    if code < 0:
        name = _signal_name(-code)
        what = f"was killed by signal {-code} ({name})"
        if -code == signal.SIGKILL and memory is not None and (oom := memory.oom_kill()) is not None:
            return RankDeath(rank, oom.text(), host, failure=FailureClass.OOM)
        if -code == signal.SIGKILL and memory is None:
            what += "; whether by the out-of-memory killer is unknown (no memory cgroup to read)"
        return RankDeath(rank, what, host, failure=class_of_signal(-code))
    return RankDeath(rank, f"exited with code {code} without reporting", host)
