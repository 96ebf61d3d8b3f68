"""DDP's waits, timed (torch.distributed ranks; see ``collective_time``).

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last bucket of
gradients. From a model's first training forward on:

- on the CPU, that wait is timed on the host's clock from the autograd engine: from the model's
  last gradient accumulated (DDP then launches its last bucket) to the end of backward, once the
  reducer has waited for every bucket (``HostWait``). DDP's own C++ allreduce, or the user's
  hook, stays as it is: one call per parameter and two callbacks a step, nothing per bucket;
- on a GPU, a model without a hook of its own gets an allreduce of the mean as its
  communication hook (what DDP does without one), the wait marked by two CUDA events on the
  device's streams (``device_waits``: NCCL waits inside a kernel, and the host does not see it).
  Users' own hooks wait where this does not look.
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

__all__ = ["HostWait", "time_ddp", "time_model", "time_on_host"]

DDP_MODULE = "torch.nn.parallel.distributed"  # loaded by ``import torch``
_HOOKED = "_hvd_magic_hooked"  # set on a DDP model once its timing was tried
_HOST_WAIT = "_hvd_magic_host_wait"  # a CPU model's HostWait
_TIMED_PARAMETER = "_hvd_magic_timed"  # set on each parameter whose gradient HostWait times
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
            time_model(self)
        host_wait = self.__dict__.get(_HOST_WAIT)
        if host_wait is not None:
            host_wait.queued = False  # a backward that raised never ran its callbacks
        return forward(self, *args, **kwargs)

    ddp._hvd_magic_timed = True
    ddp.forward = functools.wraps(forward)(forward_hooked)


def _training_forward(model: Any) -> bool:
    import torch

    return bool(torch.is_grad_enabled() and getattr(model, "require_backward_grad_sync", False))


def time_model(model: Any) -> None:
    """Time this DDP model's waits now, as its first training forward in a rank does: on the
    CPU from the autograd engine, on a CUDA GPU by DDP's default hook with events, else not."""
    model.__dict__[_HOOKED] = True  # tried once, whatever comes of it
    if model.device_type == "cpu":
        time_on_host(model)
        return
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
    """The timed default hook for a model's device: event-timed on a CUDA GPU; None elsewhere
    (the CPU is timed without a hook: ``HostWait``; other devices are not timed)."""
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


class HostWait:
    """The wait at the end of a DDP model's backward, on the host's clock: from its last gradient
    accumulated (DDP launches its last bucket's allreduce then) to the end of backward.

    The end is taken in a callback of the autograd engine queued from another: the engine runs
    the callbacks of a backward in the order queued, also those queued while they run, so it
    comes after DDP's own (queued once its last bucket was ready), which waits for every bucket.
    """

    def __init__(self) -> None:
        self.last = 0.0
        self.queued = False

    def ready(self, _parameter: Any) -> None:
        """A gradient was accumulated (each parameter's, each backward)."""
        self.last = time.perf_counter()
        if not self.queued:
            self.queued = True
            _mark(lambda: _engine().queue_callback(self._after_the_reducer))  # untimed if refused

    def _after_the_reducer(self) -> None:
        _mark(lambda: _engine().queue_callback(self._done))

    def _done(self) -> None:
        self.queued = False
        collective_time.add(time.perf_counter() - self.last)


def time_on_host(model: Any) -> None:
    """Time ``model``'s waits by ``HostWait`` (each parameter once, in whichever DDP model)."""
    try:
        parameters = [p for p in model.module.parameters() if p.requires_grad]
        if not parameters or any(getattr(p, _TIMED_PARAMETER, False) for p in parameters):
            return
        wait = HostWait()
        for parameter in parameters:
            parameter.register_post_accumulate_grad_hook(wait.ready)
            setattr(parameter, _TIMED_PARAMETER, True)
    except Exception:  # noqa: BLE001 - another torch: not timed
        return
    model.__dict__[_HOST_WAIT] = wait
    collective_time.measured()


def _engine() -> Any:
    from torch.autograd import Variable

    return Variable._execution_engine
