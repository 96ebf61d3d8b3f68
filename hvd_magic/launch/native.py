"""Native stacks of a rank whose Python cannot answer (a C call holding its interpreter lock):
py-spy's dump, native frames too (``hvd_magic[debug]``), taken on the rank's own host. The
notebook dumps the ranks on its machine; on Spark, the task a rank runs under dumps it and sends
the text back on the run's own connection (``NativeAsked``, ``NativeDumps``), so a rank on
another host is shown as well as one here."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from hvd_magic.protocol import Message, NativeAsked, NativeDumps

if TYPE_CHECKING:
    from hvd_magic.hub import Hub

__all__ = ["PY_SPY_SECONDS", "TaskDumps", "answer", "dumps", "py_spy"]

PY_SPY_SECONDS = 20.0  # for one rank's dump
_ids = itertools.count(1)


def py_spy() -> str | None:
    """py-spy (``hvd_magic[debug]``): on the PATH, or beside this Python."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def dumps(pids: dict[int, int]) -> dict[int, str]:
    """py-spy's dump of each rank in ``pids`` (rank → pid, on this machine), or why there is
    none; nothing where py-spy is not installed."""
    tool, found = py_spy(), dict[int, str]()
    if tool is None:
        return found
    for rank, pid in sorted(pids.items()):
        command = [tool, "dump", "--native", "--pid", str(pid)]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=PY_SPY_SECONDS, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            found[rank] = f"py-spy could not dump it: {err}"
            continue
        found[rank] = (done.stdout if done.returncode == 0 else done.stderr).strip()
    return found


def answer(send: Callable[[NativeDumps], object], asked: NativeAsked) -> None:
    """A Spark task's answer: the dumps of the ranks asked that run under it (its descendants:
    the rank it started, or those its exec agent's daemon started)."""
    mine = {child.pid for child in psutil.Process().children(recursive=True)}
    found = dumps({rank: pid for rank, pid in zip(asked.ranks, asked.pids, strict=True) if pid in mine})
    send(NativeDumps(asked.id, list(found), list(found.values())))


class TaskDumps:
    """The driver's end: asks every task of a Spark run for its ranks' dumps and gathers the
    answers (taken on the hub's thread; a late answer is dropped)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self._answers: dict[int, list[NativeDumps]] = {}
        self._arrived = threading.Condition()
        hub.taps[NativeDumps] = self._tap

    @classmethod
    def of(cls, hub: Hub) -> TaskDumps:
        """The hub's one (its tap is one per record type)."""
        if hub not in _task_dumps:
            _task_dumps[hub] = cls(hub)
        return _task_dumps[hub]

    def _tap(self, message: Message) -> None:
        assert isinstance(message.record, NativeDumps)
        with self._arrived:
            if message.record.id in self._answers:
                self._answers[message.record.id].append(message.record)
                self._arrived.notify_all()

    def ask(self, tasks: list[bytes], pids: dict[int, int]) -> dict[int, str]:
        """Each rank's dump, from the task it runs under, once every task answered (or each
        rank is in), or a bound passed."""
        asked, found = next(_ids), dict[int, str]()
        with self._arrived:
            self._answers[asked] = []
        for task in tasks:
            self.hub.send_to(task, NativeAsked(asked, list(pids), list(pids.values())))

        def complete() -> bool:
            found.update((r, d) for a in self._answers[asked] for r, d in zip(a.ranks, a.dumps, strict=True))
            return len(self._answers[asked]) >= len(tasks) or set(pids) <= set(found)

        with self._arrived:
            self._arrived.wait_for(complete, PY_SPY_SECONDS * 2)
            del self._answers[asked]
        return found


_task_dumps: weakref.WeakKeyDictionary[Hub, TaskDumps] = weakref.WeakKeyDictionary()
