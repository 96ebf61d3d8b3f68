"""DDP's waits, timed (torch.distributed ranks; see ``collective_time``).

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last bucket of
gradients. A DDP model on the CPU without a hook of its own gets, at its first training forward,
an allreduce of the mean as its communication hook (what DDP does without one), timed from the
launch of the iteration's last bucket to its completion. GPU buckets (NCCL) and users' own hooks
wait where this does not look.
"""

from __future__ import annotations

import functools
import time
from types import ModuleType
from typing import Any

from . import collective_time
from .after_import import when_imported

__all__ = ["time_ddp"]

DDP_MODULE = "torch.nn.parallel.distributed"  # loaded by ``import torch``
_HOOKED = "_hvd_magic_hooked"  # set on a DDP model once its communication hook is registered


def time_ddp() -> None:
    """Time DDP models made in this process (a torch.distributed rank): now if torch is
    imported, else as soon as it is."""
    when_imported(DDP_MODULE, _patch_ddp)


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
    collective_time.measured()


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
            collective_time.add(time.perf_counter() - start)
        try:
            value = done.value()[0]
        except Exception as err:  # noqa: BLE001 - handed on as it came
            result.set_exception(err)
        else:
            result.set_result(value)

    reduced.add_done_callback(settle)
    return result
