"""DDP's waits, timed (torch.distributed ranks; see ``collective_time``).

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last buckets of
gradients. From a model's first training forward on, that wait is timed from the autograd engine
(``BackwardWait``): from the end of the backward's computation (DDP has launched its last
bucket) to the end of the reducer's wait for every bucket. DDP's own C++ allreduce, or the
user's communication hook, stays as it is: the timing is one Python call per parameter and two
callbacks a step, nothing per bucket. The two ends are marked

- on the CPU, on the host's clock (the reducer's wait blocks the host);
- on a CUDA GPU, by two CUDA events on the stream the reducer's wait is queued on
  (``device_waits``: NCCL waits inside a kernel, and the host does not see it).

An earlier GPU timing replaced DDP's C++ allreduce by PyTorch's Python ``allreduce_hook`` with
events around it: on an H200 that cost +255 us on a 1.25 ms step.
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

__all__ = ["BackwardWait", "time_ddp", "time_model", "time_on_device", "time_on_host"]

DDP_MODULE = "torch.nn.parallel.distributed"  # loaded by ``import torch``
_HOOKED = "_hvd_magic_hooked"  # set on a DDP model once its timing was tried
_WAIT = "_hvd_magic_backward_wait"  # a timed model's BackwardWait
_TIMED_PARAMETER = "_hvd_magic_timed"  # set on each parameter whose gradient a BackwardWait sees
_device_waits: DeviceWaits | None = None  # this process's CUDA waits, once a model on a GPU is timed
_counted = False  # they are a source of collective_time's


def time_ddp() -> None:
    """Time DDP models made in this process (a torch.distributed rank): now if torch is
    imported, else as soon as it is."""
    when_imported(DDP_MODULE, _patch_ddp)


def _patch_ddp(module: ModuleType) -> None:
    """At a DDP model's first training forward (grads on and synced), its waits are timed."""
    ddp = module.DistributedDataParallel
    if getattr(ddp, "_hvd_magic_timed", False):
        return
    forward = ddp.forward

    def forward_hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get(_HOOKED) and _training_forward(self):
            time_model(self)
        wait = self.__dict__.get(_WAIT)
        if wait is not None:
            wait.queued = False  # a backward that raised never ran its callbacks
        return forward(self, *args, **kwargs)

    ddp._hvd_magic_timed = True
    ddp.forward = functools.wraps(forward)(forward_hooked)


def _training_forward(model: Any) -> bool:
    import torch

    return bool(torch.is_grad_enabled() and getattr(model, "require_backward_grad_sync", False))


def time_model(model: Any) -> None:
    """Time this DDP model's waits now, as its first training forward in a rank does: on the
    host's clock on the CPU, by CUDA events on a CUDA GPU, not at all on other devices."""
    model.__dict__[_HOOKED] = True  # tried once, whatever comes of it
    if model.device_type == "cpu":
        time_on_host(model)
    elif model.device_type == "cuda":
        time_on_device(model, _cuda_waits())


def time_on_host(model: Any) -> None:
    """Time ``model``'s waits on the host's clock."""
    _time(model, HostClock())


def time_on_device(model: Any, waits: DeviceWaits) -> None:
    """Time ``model``'s waits by events of its device (``waits`` makes them), counted as this
    rank's once the model is timed. A model on the CPU has no stream: its events are recorded
    with none (the tests' events)."""
    if _time(model, DeviceClock(waits, _device_of(model))):
        _count(waits)


def _time(model: Any, clock: HostClock | DeviceClock) -> bool:
    """Time ``model``'s waits by ``clock`` (each parameter once, in whichever DDP model)."""
    try:
        parameters = [p for p in model.module.parameters() if p.requires_grad]
        if not parameters or any(getattr(p, _TIMED_PARAMETER, False) for p in parameters):
            return False
        wait = BackwardWait(clock)
        for parameter in parameters:
            parameter.register_post_accumulate_grad_hook(wait.ready)
            setattr(parameter, _TIMED_PARAMETER, True)
    except Exception:  # noqa: BLE001 - another torch: not timed
        return False
    model.__dict__[_WAIT] = wait
    collective_time.measured()
    return True


class BackwardWait:
    """The wait at the end of a DDP model's backward, from the end of its computation to the end
    of the reducer's wait for every bucket, marked by ``clock``.

    Both ends are callbacks of the autograd engine, which runs a backward's callbacks once its
    graph is done, in the order queued, also those queued while they run. The first is queued
    at the model's first gradient: before DDP's own (queued once its last bucket was ready,
    after its gradient's hooks, so after this one's). The second is queued from the first: after
    DDP's, which waits for every bucket (on a GPU, queues the wait on the current stream)."""

    def __init__(self, clock: HostClock | DeviceClock) -> None:
        self.clock = clock
        self.queued = False

    def ready(self, _parameter: Any) -> None:
        """A gradient was accumulated (each parameter's, each backward)."""
        if not self.queued:
            self.queued = True
            _mark(lambda: _engine().queue_callback(self._computed))  # untimed if refused

    def _computed(self) -> None:
        start = _mark(self.clock.begin)
        if start is not None:
            _mark(lambda: _engine().queue_callback(lambda: self._waited(start)))

    def _waited(self, start: Any) -> None:
        self.queued = False
        _mark(lambda: self.clock.end(start))


class HostClock:
    """A wait's ends on the host's clock, its seconds added to this rank's waits at the end."""

    def begin(self) -> float:
        return time.perf_counter()

    def end(self, start: float) -> None:
        collective_time.add(time.perf_counter() - start)


class DeviceClock:
    """A wait's ends as events on ``device``'s current stream (none for the CPU), counted by
    ``waits`` once the device has passed them; nothing while a CUDA graph is being captured
    there (an event would break the capture)."""

    def __init__(self, waits: DeviceWaits, device: Any) -> None:
        self.waits = waits
        self.stream: Callable[[], Any] = lambda: None
        self.capturing: Callable[[], bool] = lambda: False
        if device.type == "cuda":
            import torch

            self.stream = functools.partial(torch.cuda.current_stream, device)
            self.capturing = torch.cuda.is_current_stream_capturing

    def begin(self) -> Any:
        return None if self.capturing() else self.waits.begin(self.stream())

    def end(self, start: Any) -> None:
        self.waits.end(start, self.stream())


def _device_of(model: Any) -> Any:
    return next(model.module.parameters()).device


def _cuda_waits() -> DeviceWaits:
    """This process's CUDA waits (made once, no event yet)."""
    global _device_waits
    if _device_waits is None:
        import torch

        _device_waits = DeviceWaits(functools.partial(torch.cuda.Event, enable_timing=True))
    return _device_waits


def _count(waits: DeviceWaits) -> None:
    """Count ``waits`` as this rank's, once a model marks them (not before: a rank with no
    model timed sends no waits, and is judged by wall time)."""
    global _counted
    if not _counted:
        _counted = True
        collective_time.add_source(waits)


def _mark(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except Exception:  # noqa: BLE001 - untimed is better than a failed step
        return None


@functools.cache
def _engine() -> Any:
    from torch.autograd import Variable

    return Variable._execution_engine
