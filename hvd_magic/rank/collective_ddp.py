"""DDP's waits, timed (torch.distributed ranks; see ``collective_time``).

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last bucket of
gradients. A DDP model without a hook of its own gets, at its first training forward, an
allreduce of the mean as its communication hook (what DDP does without one), timed from the
launch of the iteration's last bucket to its completion: on the CPU by the host's clock, on a
GPU by two CUDA events on the device's streams (``device_waits``: NCCL waits inside a kernel,
and the host does not see it). Users' own hooks wait where this does not look.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from hvd_magic.rank import collective_time
from hvd_magic.rank.after_import import when_imported
from hvd_magic.rank.device_waits import DeviceWaits

__all__ = ["time_ddp"]

DDP_MODULE = "torch.nn.parallel.distributed"  # loaded by ``import torch``
_HOOKED = "_hvd_magic_hooked"  # set on a DDP model once its communication hook is registered
_device_waits: DeviceWaits | None = None  # this process's CUDA waits, once a model on a GPU is hooked
_counted = False  # they are a source of collective_time's


def time_ddp() -> None:
    """Time DDP models made in this process (a torch.distributed rank): now if torch is
    imported, else as soon as it is."""
    when_imported(DDP_MODULE, _patch_ddp)


def _patch_ddp(module: ModuleType) -> None:
    """At a DDP model's first training forward (grads on and synced), DDP's own default is
    registered, timed, as its communication hook; where it could change what DDP does, nothing
    is: a hook of the user's (or one registered by DDP itself), Join, the Python reducer, DDP's
    own mixed precision, and devices other than the CPU and CUDA GPUs."""
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
        if getattr(model, "mixed_precision", None) is not None:
            return
        hook = hook_for(model.device_type)
        if hook is None:
            return
        _register_comm_hook(model.reducer, model.process_group, hook)
    except Exception:  # noqa: BLE001 - another torch, a builtin hook already there: not timed
        return
    if model.device_type == "cuda":
        _count(_cuda_waits())
    collective_time.measured()


def hook_for(device_type: str) -> Callable[[Any, Any], Any] | None:
    """The timed default hook for a model's device: host-timed on the CPU, event-timed on a
    CUDA GPU; None elsewhere (not timed)."""
    if device_type == "cpu":
        return _timed_allreduce
    if device_type == "cuda":
        return timed_on_device(_cuda_waits())
    return None


def _cuda_waits() -> DeviceWaits:
    """This process's CUDA waits (made once, no event yet)."""
    global _device_waits
    if _device_waits is None:
        import torch

        _device_waits = DeviceWaits(functools.partial(torch.cuda.Event, enable_timing=True))
    return _device_waits


def _count(waits: DeviceWaits) -> None:
    """Count ``waits`` as this rank's, once a model's hook marks them (not before: a model
    left untimed sends no waits, and is judged by wall time)."""
    global _counted
    if not _counted:
        _counted = True
        collective_time.add_source(waits)


def timed_on_device(waits: DeviceWaits) -> Callable[[Any, Any], Any]:
    """PyTorch's own ``allreduce_hook`` (what DDP does without a hook), the wait for the last
    bucket marked on the device: once its gradients are queued, and in the ``then`` that hands
    on the result, whose current stream follows the allreduce. A mark that fails leaves the
    step as PyTorch's hook makes it, untimed."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def marked_allreduce(group: Any, bucket: Any) -> Any:
        last = bucket.is_last() and not _capturing(bucket.buffer())
        start = _mark(lambda: waits.begin(_stream_of(bucket.buffer()))) if last else None
        reduced = allreduce_hook(group, bucket)
        if start is None:
            return reduced

        def marked(done: Any) -> Any:
            result = done.value()
            _mark(lambda: waits.end(start, _stream_of(result)))
            return result

        return reduced.then(marked)

    return marked_allreduce


def _stream_of(tensor: Any) -> Any:
    """The current stream of the tensor's GPU (in a ``then``, one that follows the future's
    result), whatever the process's current device; None off a GPU."""
    import torch

    return torch.cuda.current_stream(tensor.device) if tensor.is_cuda else None


def _capturing(tensor: Any) -> bool:
    """A CUDA graph is being captured on the tensor's GPU: an event there would break it."""
    import torch

    return bool(tensor.is_cuda and torch.cuda.is_current_stream_capturing())


def _mark(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except Exception:  # noqa: BLE001 - untimed is better than a failed step
        return None


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
