"""The one rule every process of a run keeps: it dies with whatever started it.

The rank sets it on itself at start; ``launch.processes.spawn`` sets it in every child it starts
(mpirun, orted, rsh clients, ranks), so a dead kernel, Spark task or agent leaves nothing running.
A process that lives as long as another that did not start it (a fork server shared by an
executor's Python workers) waits for that one's end (``wait_for_end_of``).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import time
from typing import Any

__all__ = ["die_with_parent", "wait_for_end_of"]

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


def wait_for_end_of(pid: int) -> None:
    """Returns once the process ``pid`` has ended (at once if there is none)."""
    try:
        select.select([os.pidfd_open(pid)], [], [])  # readable once the process has ended
    except OSError:  # gone already, or a kernel without pidfds: looked for once a second
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(1.0)
