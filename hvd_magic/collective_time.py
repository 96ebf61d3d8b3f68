"""The seconds a rank has spent waiting in collectives (rank side).

In lock-step training every rank makes the same steps/s: the fast ranks wait, inside the
allreduce, for the slow one. What tells them apart is the time each spends outside collectives:
its own work (data, forward, backward). ``hvd_magic.report(step=...)`` sends this clock with each
step (``w``), so the notebook judges steps per second of a rank's own time (``stragglers``).

Horovod's PyTorch binding waits for every collective in one Python function, ``synchronize``
(``hvd.allreduce``, ``broadcast_parameters`` and ``DistributedOptimizer.step`` all end in it): it is
timed once ``horovod.torch`` has been imported.

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last bucket of
gradients. On torch.distributed ranks (``time_ddp``), a model wrapped in DDP gets, before its
first forward, a communication hook: PyTorch's own ``allreduce_hook`` (what DDP does without one),
or the user's hook where they registered one, timed from the launch of the iteration's last
bucket to its completion. TensorFlow's graphs wait where Python cannot see: their ranks send no
``w`` and are judged by wall time.
"""

from __future__ import annotations

import functools
import importlib.machinery
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["time_ddp", "waited"]

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
_measured = False  # a DDP model has been hooked

DDP_MODULE = "torch.nn.parallel.distributed"  # loaded by ``import torch``
_HOOKED = "_hvd_magic_hooked"  # set on a DDP model once its communication hook is registered


def waited() -> float | None:
    """Seconds this process has waited in collectives so far; None while nothing is measured
    (``horovod.torch`` not imported, no DDP model hooked)."""
    if not _installed and not _install() and not _measured:
        return None
    return _seconds


def _add(spent: float) -> None:
    global _seconds
    with _lock:
        _seconds += spent


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
            _add(time.perf_counter() - start)

    return timed


def time_ddp() -> None:
    """Hook DDP models made in this process (a torch.distributed rank): now if torch is
    imported, else as soon as it is."""
    module = sys.modules.get(DDP_MODULE)
    if module is not None:
        _patch_ddp(module)
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(DDP_MODULE, _patch_ddp))


class _AfterImport:
    """A finder that lets the usual ones load module ``name``, then hands it to ``then``."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, then = loader.exec_module, self.then

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            then(module)

        loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def _patch_ddp(module: ModuleType) -> None:
    ddp = module.DistributedDataParallel
    if getattr(ddp, "_hvd_magic_timed", False):
        return  # patched already
    forward, register, builtin = ddp.forward, ddp.register_comm_hook, ddp._register_builtin_comm_hook

    def forward_hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, _HOOKED, False):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            register_timed(self, self.process_group, allreduce_hook)
        return forward(self, *args, **kwargs)

    def register_timed(self: Any, state: object, hook: Callable[..., Any]) -> None:
        global _measured
        register(self, state, _timed_hook(hook))
        setattr(self, _HOOKED, True)
        _measured = True

    def builtin_marked(self: Any, comm_hook_type: Any) -> None:
        builtin(self, comm_hook_type)  # a hook in C++: its waits are not seen
        setattr(self, _HOOKED, True)

    ddp._hvd_magic_timed = True
    ddp.forward = functools.wraps(forward)(forward_hooked)
    ddp.register_comm_hook = functools.wraps(register)(register_timed)
    ddp._register_builtin_comm_hook = functools.wraps(builtin)(builtin_marked)


def _timed_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook``, timed from the launch of an iteration's last bucket to its completion: DDP
    waits for it once the backward pass is done."""

    @functools.wraps(hook)
    def timed(state: object, bucket: Any) -> Any:
        future = hook(state, bucket)
        if not bucket.is_last():
            return future
        start = time.perf_counter()

        def done(fut: Any) -> Any:
            _add(time.perf_counter() - start)
            return fut.value()

        return future.then(done)

    return timed
