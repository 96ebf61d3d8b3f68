"""A run's scratch directory on an executor that is cleaned up even when the task is SIGKILLed.

Spark kills a lost or cancelled executor's Python workers with SIGKILL, so no ``finally`` and no
``atexit`` of ours runs there: Open MPI's session directories and shared-memory files would stay
on the host for good (found on the multi-host bed). Two things remove them by construction:

- a watcher, started with the directory: it reads a pipe that only the owner holds, and removes
  the directory at end of file, which comes when the owner closes the pipe or dies, however it
  dies (its own session, no parent-death signal: it outlives the owner by a moment);
- a lock file the owner holds (``flock``) as long as it lives: the kernel drops it when the owner
  dies, and the next task that claims a directory on the host removes every directory no process
  holds (what is left when the whole host was killed, the watcher with it). A directory is made
  under a staging name and renamed once locked, so a sweep never sees one not yet held.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

__all__ = ["PREFIX", "HeldDir", "sweep_unheld"]

PREFIX = "hvd_magic-shm-"
_STAGING = ".hvd_magic-new-"
_LOCK = ".owner.lock"
_WATCH = 'while read -r _; do :; done; rm -rf -- "$0"'  # until end of file, then remove "$0"


@dataclass
class HeldDir:
    """A directory held by this process (its ``fd`` holds the lock) until ``remove``."""

    path: str
    fd: int
    watcher: subprocess.Popen[bytes] | None = None

    @classmethod
    def claim(cls, base: str | None = None) -> HeldDir:
        """A new held directory under ``base`` (the system's temporary folder), once those left
        by dead owners are gone."""
        base = base or tempfile.gettempdir()
        sweep_unheld(base)
        staging = tempfile.mkdtemp(prefix=_STAGING, dir=base)
        fd = os.open(os.path.join(staging, _LOCK), os.O_CREAT | os.O_RDWR, 0o600)  # not inherited
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(base, PREFIX + os.path.basename(staging)[len(_STAGING) :])
        os.rename(staging, path)
        return cls(path, fd, _watch(path))

    def remove(self) -> None:
        if self.watcher is not None and self.watcher.stdin is not None:
            self.watcher.stdin.close()  # the watcher removes it and ends
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watcher.wait(timeout=5)
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _watch(path: str) -> subprocess.Popen[bytes] | None:
    """The watcher that removes ``path`` once this process closed its pipe or died (None if it
    cannot start: the next claim's sweep removes the directory then)."""
    try:
        return subprocess.Popen(
            ["/bin/sh", "-c", _WATCH, path],
            stdin=subprocess.PIPE,  # its other end is this process's only: not inherited
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None


def sweep_unheld(base: str) -> list[str]:
    """Remove the directories under ``base`` whose owner is gone; the paths removed."""
    removed = []
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        if name.startswith(PREFIX) and _unheld(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _unheld(path: str) -> bool:
    """Whether no process holds ``path``'s lock (taking it for a moment to find out)."""
    try:
        fd = os.open(os.path.join(path, _LOCK), os.O_RDWR)
    except OSError:  # no lock file: not one of ours, or half removed already
        return os.path.isdir(path) and not os.path.exists(os.path.join(path, _LOCK))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
