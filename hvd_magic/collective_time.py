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
from typing import Any

__all__ = ["waited"]

# Modules of Horovod's PyTorch binding that hold ``synchronize`` under that name (the first defines it).
TIMED_MODULES = (
    "horovod.torch.mpi_ops",
    "horovod.torch.optimizer",
    "horovod.torch.functions",
    "horovod.torch.sync_batch_norm",
    "horovod.torch",
)

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
    """Wrap ``synchronize`` once, where each module holds it (one dict lookup per call until
    ``horovod.torch`` is imported: ``report`` calls this on every step)."""
    global _installed
    original = getattr(sys.modules.get(TIMED_MODULES[0]), "synchronize", None)
    if original is None:
        return False
    timed = _timed(original)
    for name in TIMED_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "synchronize", None) is original:
            module.synchronize = timed  # type: ignore[attr-defined]
    _installed = True
    return True


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

    return timed
