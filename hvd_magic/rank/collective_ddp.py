"""DDP's waits, timed (torch.distributed ranks; see ``collective_time``).

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last buckets of
gradients. That wait is timed from the autograd engine (``BackwardWait``): from the end of the
backward's computation (DDP has launched its last bucket) to the end of the reducer's wait for
every bucket. DDP's own C++ allreduce, or the user's communication hook, stays as it is. The
two ends are marked

- on the CPU, on the host's clock (the reducer's wait blocks the host);
- on a CUDA GPU, by two CUDA events on the stream the reducer's wait is queued on
  (``device_waits``: NCCL waits inside a kernel, and the host does not see it).

Every training step is timed. Timing one step in many was tried and taken back: a weighted
sample is right on average but too noisy for a rank that waits most of its time (see
docs/stragglers.md). On an H200, with a 1.2 ms step, timing a step cost about 20 us in Python
and 70 us for each CUDA event recorded from the backward (measured, not explained), before the
timed path was made flat (below). So the timing measures what it costs each model's steps, once,
and where that is over its limit, stops (``timing_cost``).
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from hvd_magic.rank import collective_time
from hvd_magic.rank.after_import import when_imported
from hvd_magic.rank.device_waits import DeviceWaits
from hvd_magic.rank.timing_cost import LimitedSteps, timing_limit

__all__ = ["BackwardWait", "time_ddp", "time_model", "time_on_device", "time_on_host"]

DDP_MODULE = "torch.nn.parallel.distributed"  # loaded by ``import torch``
# The DDP models whose timing was tried: their BackwardWait, or None where not timed. Kept here,
# not on the model, so that a model pickles and copies as DDP does (a copy is timed anew).
_tried: weakref.WeakKeyDictionary[Any, BackwardWait | None] = weakref.WeakKeyDictionary()
_device_waits: dict[int, DeviceWaits] = {}  # this process's CUDA waits, by device (their events)
_counted: set[int] = set()  # the waits counted as this rank's (their ids)
_UNTRIED: Any = object()  # a model not in _tried
_stopped = False  # timing cost too much: no model is timed from now on


def time_ddp() -> None:
    """Time DDP models made in this process (a torch.distributed rank): now if torch is
    imported, else as soon as it is."""
    when_imported(DDP_MODULE, _patch_ddp)


def _patch_ddp(module: ModuleType) -> None:
    """At a DDP model's first training forward (grads on and synced), its waits are timed; each
    training forward after it is a timed step."""
    import torch

    ddp = module.DistributedDataParallel
    if getattr(ddp, "_hvd_magic_timed", False):
        return
    forward = ddp.forward
    is_grad_enabled = torch.is_grad_enabled

    def forward_hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if is_grad_enabled():
            wait = _tried.get(self, _UNTRIED)
            synced = getattr(self, "require_backward_grad_sync", False)
            if wait is _UNTRIED and synced:
                _mark(functools.partial(time_model, self))
                wait = _tried.get(self)
            if isinstance(wait, BackwardWait):
                wait.step(synced)
        return forward(self, *args, **kwargs)

    ddp._hvd_magic_timed = True
    ddp.forward = functools.wraps(forward)(forward_hooked)


def time_model(model: Any) -> None:
    """Time this DDP model's waits from its next training forward on (``time_ddp`` must be in
    place), as its first training forward in a rank does: on the host's clock on the CPU, by
    CUDA events on a CUDA GPU, not at all on other devices."""
    _untimed(model)  # tried once, whatever comes of it
    if _stopped:  # timing cost a model's steps too much
        return
    if model.device_type == "cpu":
        time_on_host(model)
    elif model.device_type == "cuda":
        time_on_device(model, _cuda_waits(_parameter(model).device.index))


def time_on_host(model: Any) -> None:
    """Time ``model``'s waits on the host's clock."""
    _time(model, HostClock())


def time_on_device(model: Any, waits: DeviceWaits) -> None:
    """Time ``model``'s waits by events of its device (``waits`` makes them), counted as this
    rank's. A model on the CPU has no stream: its events are recorded with none (the tests')."""
    _time(model, DeviceClock(waits, _parameter(model).device))
    if id(waits) not in _counted:
        _counted.add(id(waits))
        collective_time.add_source(waits)


def _untimed(model: Any) -> None:
    """Mark ``model`` tried and not timed (a wait it had before drops its hook)."""
    previous = _tried.get(model)
    if previous is not None:
        previous.forget()
    _tried[model] = None


def _time(model: Any, clock: HostClock | DeviceClock) -> None:
    _untimed(model)
    limit = timing_limit()
    limited = LimitedSteps(limit, _stop) if limit is not None else None
    wait = _tried[model] = BackwardWait(clock, _parameter(model), limited)
    weakref.finalize(model, wait.forget)  # the hook goes with the model (a module wrapped anew)
    collective_time.measured()


def _stop() -> None:
    """Time no model from now on (the timing cost too much)."""
    global _stopped
    _stopped = True
    for model in list(_tried.keys()):
        _untimed(model)


def _parameter(model: Any) -> Any:
    """The model's first parameter that gets a gradient and that DDP reduces (a hook on it is
    called before DDP's own, where its gradient is the last ready)."""
    ignored = set(getattr(model, "parameters_to_ignore", ()))
    return next(p for name, p in model.module.named_parameters() if p.requires_grad and name not in ignored)


class BackwardWait:
    """The wait at the end of a DDP model's backward, from the end of its computation to the end
    of the reducer's wait for every bucket, marked by ``clock`` in the first backward after a
    training forward (``armed``).

    Both ends are callbacks of the autograd engine, which runs a backward's callbacks once its
    graph is done, in the order queued, also those queued while they run. The first is queued
    when ``parameter``'s gradient is accumulated: before DDP's own (queued once its last bucket is
    ready, in a hook that runs after this one where ``parameter`` is the last). It is queued only
    by a backward that accumulates the parameters' gradients (not by ``autograd.grad``), and in
    the nested backward of reentrant checkpointing, where DDP's wait then is. The second is queued
    from the first: after DDP's, which waits for every bucket (on a GPU, queues the wait on the
    current stream). A forward whose backward never came is not timed (an eval forward; of two
    forwards before a backward, the backward is timed once)."""

    def __init__(self, clock: HostClock | DeviceClock, parameter: Any, limited: LimitedSteps | None) -> None:
        self.clock = clock
        self.limited = limited  # what the timing costs, until known (then None)
        self.armed = False  # a training forward ran whose backward has not been timed yet
        self.queue = _engine().queue_callback  # runs a callback once the backward's graph is done
        self.hook = parameter.register_post_accumulate_grad_hook(self._accumulated)

    def step(self, synced: bool) -> None:
        """A training forward: time its backward, unless under ``no_sync`` (that backward waits
        for nothing) or left untimed to measure what timing costs."""
        limited = self.limited
        if synced and limited is not None:
            try:
                synced, done = limited.step(), limited.probe.done
            except Exception:  # noqa: BLE001 - timed without a limit rather than a failed step
                limited.forget()
                done = True
            if done:
                self.limited = None
        self.armed = synced

    def forget(self) -> None:
        """Time no more (the model is timed anew, or is gone, or its timing cost too much)."""
        self.hook.remove()
        self.armed = False
        if self.limited is not None:
            self.limited.forget()

    # These two, and the end a clock gives, run inside every timed backward, where each line of
    # Python costs several times what it costs in a loop (measured: 6-9 us a call on the CPU,
    # caches cold after the backward's kernels): they are kept flat. None may raise into the
    # autograd engine (untimed is better than a failed step).

    def _accumulated(self, _parameter: Any) -> None:
        """The parameter's gradient was accumulated (each backward; the first after a training
        forward ends its wait)."""
        if self.armed:
            self.armed = False
            try:
                self.queue(self._computed)
            except Exception:  # noqa: BLE001
                pass

    def _computed(self) -> None:
        try:
            end = self.clock.begin()
            if end is not None:
                self.queue(end)
        except Exception:  # noqa: BLE001
            pass


class HostClock:
    """A wait's ends on the host's clock, its seconds added to this rank's waits at the end."""

    def begin(self) -> Callable[[], None]:
        """Mark the wait's start; what marks its end."""
        start, now, add = time.perf_counter(), time.perf_counter, collective_time.add
        return lambda: add(now() - start)


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

    def begin(self) -> Callable[[], None] | None:
        """Mark the wait's start; what marks its end (None while a graph is captured)."""
        return None if self.capturing() else functools.partial(self.end, self.waits.begin(self.stream()))

    def end(self, start: Any) -> None:
        try:
            self.waits.end(start, self.stream())
        except Exception:  # noqa: BLE001 - a wait not counted, not a failed backward
            pass


def _cuda_waits(device: int | None) -> DeviceWaits:
    """This process's waits on a CUDA device (made once a device, no event yet: an event is
    recorded again only on its own device)."""
    index = device or 0
    if index not in _device_waits:
        import torch

        _device_waits[index] = DeviceWaits(functools.partial(torch.cuda.Event, enable_timing=True))
    return _device_waits[index]


def _mark(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except Exception:  # noqa: BLE001 - untimed is better than a failed step
        return None


@functools.cache
def _engine() -> Any:
    from torch.autograd import Variable

    return Variable._execution_engine
