"""The seconds a rank has spent waiting in Horovod's collectives (rank side).

In lock-step training every rank makes the same steps/s: the fast ranks wait, inside the
allreduce, for the slow one. What tells them apart is the time each spends outside collectives:
its own work (data, forward, backward). ``hvd_magic.report(step=...)`` sends this clock with each
step (``w``), so the notebook judges steps per second of a rank's own time (``stragglers``).

Horovod's PyTorch binding waits for every collective in one Python function, ``synchronize``
(``hvd.allreduce``, ``broadcast_parameters`` and ``DistributedOptimizer.step`` all end in it): it is
timed once ``horovod.torch`` has been imported. Other frameworks' waits (TensorFlow graphs, DDP's
reducer) are not seen from Python: their ranks send no ``w`` and are judged by wall time.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["waited"]

# Modules of Horovod's PyTorch binding that hold ``synchronize`` under that name.
TIMED_MODULES = (
    "horovod.torch.mpi_ops",
    "horovod.torch.optimizer",
    "horovod.torch.functions",
    "horovod.torch.sync_batch_norm",
    "horovod.torch",
)
_MARK = "_hvd_magic_timed"

_lock = threading.Lock()
_seconds = 0.0
_installed = False


def waited() -> float | None:
    """Seconds this process has waited in Horovod's collectives so far; None while
    ``horovod.torch`` is not imported (nothing is measured)."""
    if not _installed and not _install():
        return None
    return _seconds


def _install() -> bool:
    global _installed
    modules = [sys.modules.get(name) for name in TIMED_MODULES]
    if modules[0] is None:
        return False
    original = getattr(modules[0], "synchronize", None)
    if original is None:
        return False
    timed = original if getattr(original, _MARK, False) else _timed(original)
    for module in modules:
        _replace(module, original, timed)
    _installed = True
    return True


def _replace(module: ModuleType | None, original: Any, timed: Any) -> None:
    if module is not None and getattr(module, "synchronize", None) is original:
        module.synchronize = timed  # type: ignore[attr-defined]


def _timed(synchronize: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(synchronize)
    def timed(*args: Any, **kwargs: Any) -> Any:
        global _seconds
        start = time.perf_counter()
        try:
            return synchronize(*args, **kwargs)
        finally:
            spent = time.perf_counter() - start
            with _lock:
                _seconds += spent

    setattr(timed, _MARK, True)
    return timed


def _reset() -> None:
    """Forget the clock (a test's fresh start); what was timed stays timed."""
    global _seconds, _installed
    with _lock:
        _seconds, _installed = 0.0, False
