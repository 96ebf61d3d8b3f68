"""The seconds a rank has spent waiting in collectives (rank side).

In lock-step training every rank makes the same steps/s: the fast ranks wait, inside the
allreduce, for the slow one. What tells them apart is the time each spends outside collectives:
its own work (data, forward, backward). ``hvd_magic.report(step=...)`` sends this clock with each
step (``w``), so the notebook judges steps per second of a rank's own time (``stragglers``).

Horovod's PyTorch binding waits for every collective in one Python function, ``synchronize``
(``hvd.allreduce``, ``broadcast_parameters`` and ``DistributedOptimizer.step`` all end in it): it is
timed once ``horovod.torch`` has been imported.

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last bucket of
gradients. On torch.distributed ranks (``time_ddp``), a DDP model on the CPU without a hook of
its own gets, at its first training forward, an allreduce of the mean as its communication
hook (what DDP does without one), timed from the launch of the iteration's last bucket to its
completion. TensorFlow's graphs, GPU buckets (NCCL) and users' own hooks wait where this does
not look: their ranks send no ``w`` and are judged by wall time.
"""

from __future__ import annotations

import functools
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
    """Time DDP models made in this process (a torch.distributed rank): now if torch is
    imported, else as soon as it is."""
    module = sys.modules.get(DDP_MODULE)
    if module is not None:
        _patch_ddp(module)
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(DDP_MODULE, _patch_ddp))


class _AfterImport:
    """A finder that lets the other finders find module ``name``, then hands the loaded module
    to ``then`` (whose failure never fails the import)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then, self.asked = name, then, False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self.asked:
            return None
        self.asked = True
        others = sys.meta_path[sys.meta_path.index(self) + 1 :]
        spec = next((found for f in others if (found := _find(f, fullname, path, target)) is not None), None)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, then = loader.exec_module, self.then

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                then(module)
            except Exception:  # noqa: BLE001 - unmeasured is better than a failed import
                pass

        loader.exec_module = exec_then
        return spec


def _find(finder: Any, fullname: str, path: Any, target: Any) -> Any:
    find_spec = getattr(finder, "find_spec", None)
    return None if find_spec is None else find_spec(fullname, path, target)


def _patch_ddp(module: ModuleType) -> None:
    """At a DDP model's first training forward (grads on and synced), DDP's own default is
    registered, timed, as its communication hook; where it could change what DDP does, nothing
    is: a hook of the user's (or one registered by DDP itself), Join, the Python reducer, and GPU
    buckets (NCCL's futures complete at launch: the wait is on the device, not timed here)."""
    ddp = module.DistributedDataParallel
    if getattr(ddp, "_hvd_magic_timed", False):
        return
    forward = ddp.forward

    def forward_hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get(_HOOKED) and _training_forward(self):
            _hook_default(self)
        return forward(self, *args, **kwargs)

    ddp._hvd_magic_timed = True
    ddp.forward = functools.wraps(forward)(forward_hooked)


def _training_forward(model: Any) -> bool:
    import torch

    return bool(torch.is_grad_enabled() and getattr(model, "require_backward_grad_sync", False))


def _hook_default(model: Any) -> None:
    global _measured
    model.__dict__[_HOOKED] = True  # tried once, whatever comes of it
    try:
        from torch.distributed import _register_comm_hook  # type: ignore[attr-defined]

        if not model._lazy_init_ran:
            model._lazy_init()  # as its forward would: it may register hooks of DDP's own
        if model._comm_hooks or model._use_python_reducer or model._join_config.enable:
            return
        if model.device_type != "cpu" or getattr(model, "mixed_precision", None) is not None:
            return
        _register_comm_hook(model.reducer, model.process_group, _timed_allreduce)
    except Exception:  # noqa: BLE001 - another torch, a builtin hook already there: not timed
        return
    _measured = True


def _timed_allreduce(group: Any, bucket: Any) -> Any:
    """PyTorch's ``allreduce_hook`` (the mean of the ranks' gradients), timed from the launch of
    an iteration's last bucket to its completion: DDP waits for it once the backward pass is
    done. Its future is settled by hand (not ``then``) so that a failed allreduce raises
    torch's own error, as DDP without a hook does."""
    import torch
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    buffer.div_(group.size())
    start = time.perf_counter() if bucket.is_last() else None
    reduced = dist.all_reduce(buffer, group=group, async_op=True).get_future()
    result: Any = torch.futures.Future()

    def settle(done: Any) -> None:
        if start is not None:
            _add(time.perf_counter() - start)
        try:
            value = done.value()[0]
        except Exception as err:  # noqa: BLE001 - handed on as it came
            result.set_exception(err)
        else:
            result.set_result(value)

    reduced.add_done_callback(settle)
    return result
