"""The one rule every process of a run keeps: it dies with whatever started it.

The rank sets it on itself at start; ``launch.processes.spawn`` sets it in every child it starts
(mpirun, orted, rsh clients, ranks), so a dead kernel, Spark task or agent leaves nothing running.
"""

from __future__ import annotations

import ctypes
import signal
from typing import Any

__all__ = ["die_with_parent"]

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
