"""The seconds a rank has spent waiting in collectives (rank side).

In lock-step training every rank makes the same steps/s: the fast ranks wait, inside the
allreduce, for the slow one. What tells them apart is the time each spends outside collectives:
its own work (data, forward, backward). ``hvd_magic.report(step=...)`` sends this clock with each
step (``w``), so the notebook judges steps per second of a rank's own time (``stragglers``).

Where the waits are timed:

- Horovod's PyTorch binding waits for every collective in one Python function, ``synchronize``
  (``hvd.allreduce``, ``broadcast_parameters`` and ``DistributedOptimizer.step`` all end in it):
  timed here once ``horovod.torch`` has been imported;
- DDP's gradient allreduce, on the CPU and on CUDA GPUs (by events on the device: ``device_waits``):
  ``collective_ddp``;
- Horovod's TensorFlow gradient allreduce, in the graph: ``collective_tf``.

Elsewhere (TF1-style graphs, steps XLA compiles, accelerators other than CUDA GPUs) a rank
sends no ``w`` and is judged by wall time. It sends none either while the figure is held (``hold``:
DDP's timing measuring what it costs, ``timing_cost``), nor once the timing is off (``switch_off``:
``stragglers=off``, or a timing that cost over its limit).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["add", "add_source", "end_hold", "hold", "is_off", "measured", "switch_off", "timed", "waited"]

# Modules of Horovod's PyTorch binding that hold ``synchronize`` under that name (the first defines it).
TIMED_MODULES = (
    "horovod.torch.mpi_ops",
    "horovod.torch.optimizer",
    "horovod.torch.functions",
    "horovod.torch.sync_batch_norm",
    "horovod.torch",
)

# Seconds waited, a cell per thread that waited: each thread adds to its own cell only, so no
# lock is taken where the waits are timed (inside DDP's backward an uncontended lock cost 3.5 us
# a step, half the rest of the timing's Python there); a read sums the cells.
_cells: dict[int, list[float]] = {}
_installed = False
_measured = False  # a timer other than Horovod-torch's is in place (DDP, TensorFlow)
_sources: list[Callable[[], float]] = []  # clocks kept elsewhere (TensorFlow's, in its graph)
_off = False  # nothing is timed in this process (stragglers=off, or its timing cost too much)
_holds: dict[object, float] = {}  # what holds the figure back, until when (perf_counter's clock)
_said = 0.0  # the figure last said
_held = False  # a hold kept the last call from saying one
_unsaid = 0.0  # seconds waited while held, left out of the figure


def waited() -> float | None:
    """Seconds this process has waited in collectives so far; None while nothing is measured
    (``horovod.torch`` not imported, no DDP model hooked, no TensorFlow allreduce timed) or held.
    After a hold the figure goes on from the last one said: the waits in between are left out."""
    global _said, _held, _unsaid
    if _off or (not _installed and not _install() and not _measured):
        return None
    if _holds and _holding():
        _held = True
        return None
    total = sum(cell[0] for cell in list(_cells.values())) + sum(_read(source) for source in _sources)
    if _held:
        _held, _unsaid = False, total - _said
    _said = total - _unsaid
    return _said


def hold(key: object, seconds: float) -> None:
    """Say no figure (``waited`` is None) until ``end_hold(key)``, or for ``seconds`` at most."""
    _holds[key] = time.perf_counter() + seconds


def end_hold(key: object) -> None:
    """End ``key``'s hold (if any)."""
    _holds.pop(key, None)


def _holding() -> bool:
    now = time.perf_counter()
    for key, until in list(_holds.items()):
        if until <= now:
            _holds.pop(key, None)  # a hold whose holder went quiet (its model trains no more)
    return bool(_holds)


def _read(source: Callable[[], float]) -> float:
    try:
        return source()
    except Exception:  # noqa: BLE001 - a step's report never fails for want of this figure
        return 0.0


def switch_off() -> None:
    """Time nothing in this process (``stragglers=off``, or a timing over its limit): ``waited``
    says None from now on."""
    global _off
    _off = True


def is_off() -> bool:
    """Whether ``switch_off`` was called in this process."""
    return _off


def add(spent: float) -> None:
    """Count ``spent`` seconds of waiting (in this thread's cell)."""
    cell = _cells.get(threading.get_ident())
    if cell is None:
        cell = _cells.setdefault(threading.get_ident(), [0.0])
    cell[0] += spent


def measured() -> None:
    """Say that a timer is in place: ``waited`` counts from now on."""
    global _measured
    _measured = True


def add_source(source: Callable[[], float]) -> None:
    """Count the seconds another clock has timed (read when ``waited`` is)."""
    _sources.append(source)
    measured()


def _install() -> bool:
    """Wrap ``synchronize`` once, where each module holds it (one dict lookup per call until
    ``horovod.torch`` is imported: ``report`` calls this on every step)."""
    global _installed
    original = getattr(sys.modules.get(TIMED_MODULES[0]), "synchronize", None)
    if original is None:
        return False
    timed_one = timed(original)
    for name in TIMED_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "synchronize", None) is original:
            module.synchronize = timed_one  # type: ignore[attr-defined]
    _installed = True
    return True


def timed(synchronize: Callable[..., Any]) -> Callable[..., Any]:
    """``synchronize`` (or any call that waits), its seconds counted (``add``)."""

    @functools.wraps(synchronize)
    def timed_call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return synchronize(*args, **kwargs)
        finally:
            add(time.perf_counter() - start)

    return timed_call
