"""Native stacks of a rank whose Python cannot answer (a C call holding its interpreter lock):
py-spy's dump, native frames too (``hvd_magic[debug]``), taken on the rank's own host. The
notebook dumps the ranks on its machine; on Spark, the task a rank runs under dumps it and sends
the text back on the run's own connection (``NativeAsked``, ``NativeDumps``), so a rank on
another host is shown as well as one here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

from hvd_magic.hub import Hub, Replies
from hvd_magic.protocol import Message, NativeAsked, NativeDumps

__all__ = ["PY_SPY_SECONDS", "answer", "ask_tasks", "dumps", "py_spy"]

PY_SPY_SECONDS = 20.0  # for one rank's dump


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
    """A Spark task's answer: the dumps of the ranks asked that run under it (the rank it started,
    or those its exec agent's daemon started; forked from a server, if warm)."""
    from hvd_magic.warm.servers import own_processes

    mine = {process.pid for process in own_processes()}
    found = dumps({rank: pid for rank, pid in zip(asked.ranks, asked.pids, strict=True) if pid in mine})
    send(NativeDumps(asked.id, list(found), list(found.values())))


def ask_tasks(hub: Hub, tasks: list[bytes], pids: dict[int, int]) -> dict[int, str]:
    """The driver's end on Spark: each rank's dump, from the task it runs under, once every task
    answered (or each rank is in), or a bound passed."""

    def send(asked: int) -> None:
        for task in tasks:
            hub.send_to(task, NativeAsked(asked, list(pids), list(pids.values())))

    def enough(answers: list[Message]) -> bool:
        return len(answers) >= len(tasks) or set(pids) <= set(_dumps_in(answers))

    return _dumps_in(Replies.of(hub, NativeDumps).ask(send, enough, PY_SPY_SECONDS * 2))


def _dumps_in(answers: list[Message]) -> dict[int, str]:
    found = dict[int, str]()
    for answer in answers:
        record = cast(NativeDumps, answer.record)
        found.update(zip(record.ranks, record.dumps, strict=True))
    return found
