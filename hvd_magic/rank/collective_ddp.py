"""DDP's waits, timed (torch.distributed ranks; see ``collective_time``).

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last buckets of
gradients. That wait is timed from the autograd engine (``BackwardWait``): from the end of the
backward's computation (DDP has launched its last bucket) to the end of the reducer's wait for
every bucket. DDP's own C++ allreduce, or the user's communication hook, stays as it is. The
two ends are marked

- on the CPU, on the host's clock (the reducer's wait blocks the host);
- on a CUDA GPU, by two CUDA events on the stream the reducer's wait is queued on
  (``device_waits``: NCCL waits inside a kernel, and the host does not see it).

Steps can be sampled (``Sampler``: each with a chance, its wait counted for the steps it stands
for), but all are timed for now (``SAMPLE_SECONDS``). On an H200, with a 1.2 ms step, timing a
step cost about 20 us in Python and 70 us for each CUDA event recorded from the backward
(measured, not explained).
"""

from __future__ import annotations

import functools
import random
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from hvd_magic.rank import collective_time
from hvd_magic.rank.after_import import when_imported
from hvd_magic.rank.device_waits import DeviceWaits

__all__ = ["BackwardWait", "Sampler", "time_ddp", "time_model", "time_on_device", "time_on_host"]

DDP_MODULE = "torch.nn.parallel.distributed"  # loaded by ``import torch``
# Every step is timed (0). Sampling (about one step each SAMPLE_SECONDS) works and is tested, but
# stays off: the straggler watch reads a rate on the rank's own clock (wall time less waits) and
# drops the intervals where that clock ran back, which a weighted sample's jump makes it do at
# fast steps, so a waiting rank would look like the others. It can come on once rates are judged
# over windows that take such jumps.
SAMPLE_SECONDS = 0.0
# The DDP models whose timing was tried: their BackwardWait, or None where not timed. Kept here,
# not on the model, so that a model pickles and copies as DDP does (a copy is timed anew).
_tried: weakref.WeakKeyDictionary[Any, BackwardWait | None] = weakref.WeakKeyDictionary()
_device_waits: dict[int, DeviceWaits] = {}  # this process's CUDA waits, by device (their events)
_counted: set[int] = set()  # the waits counted as this rank's (their ids)


def time_ddp() -> None:
    """Time DDP models made in this process (a torch.distributed rank): now if torch is
    imported, else as soon as it is."""
    when_imported(DDP_MODULE, _patch_ddp)


def _patch_ddp(module: ModuleType) -> None:
    """At a DDP model's first training forward (grads on and synced), its waits are timed; each
    training forward after it may be a timed step."""
    import torch

    ddp = module.DistributedDataParallel
    if getattr(ddp, "_hvd_magic_timed", False):
        return
    forward = ddp.forward

    def forward_hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        training = torch.is_grad_enabled() and getattr(self, "require_backward_grad_sync", False)
        if training and self not in _tried:
            _mark(functools.partial(time_model, self))
        wait = _tried.get(self) if training else None
        if wait is not None:
            _mark(wait.before_step)
        return forward(self, *args, **kwargs)

    ddp._hvd_magic_timed = True
    ddp.forward = functools.wraps(forward)(forward_hooked)


def time_model(model: Any, every: float = SAMPLE_SECONDS) -> None:
    """Time this DDP model's waits from its next training forward on (``time_ddp`` must be in
    place), as its first training forward in a rank does: on the host's clock on the CPU, by
    CUDA events on a CUDA GPU, not at all on other devices; a step about each ``every`` seconds
    (0: every step)."""
    _untimed(model)  # tried once, whatever comes of it
    if model.device_type == "cpu":
        time_on_host(model, every)
    elif model.device_type == "cuda":
        time_on_device(model, _cuda_waits(_parameter(model).device.index), every)


def time_on_host(model: Any, every: float = SAMPLE_SECONDS) -> None:
    """Time ``model``'s waits on the host's clock."""
    _time(model, HostClock(), every)


def time_on_device(model: Any, waits: DeviceWaits, every: float = SAMPLE_SECONDS) -> None:
    """Time ``model``'s waits by events of its device (``waits`` makes them), counted as this
    rank's. A model on the CPU has no stream: its events are recorded with none (the tests')."""
    _time(model, DeviceClock(waits, _parameter(model).device), every)
    if id(waits) not in _counted:
        _counted.add(id(waits))
        collective_time.add_source(waits)


def _untimed(model: Any) -> None:
    """Mark ``model`` tried and not timed (a wait it had before drops its hook)."""
    previous = _tried.get(model)
    if previous is not None:
        previous.forget()
    _tried[model] = None


def _time(model: Any, clock: HostClock | DeviceClock, every: float) -> None:
    _untimed(model)
    _tried[model] = BackwardWait(clock, Sampler(every), _parameter(model))
    collective_time.measured()


def _parameter(model: Any) -> Any:
    """The model's first parameter that gets a gradient and that DDP reduces (a hook on it is
    called before DDP's own, where its gradient is the last ready)."""
    ignored = set(getattr(model, "parameters_to_ignore", ()))
    return next(p for name, p in model.module.named_parameters() if p.requires_grad and name not in ignored)


class Sampler:
    """Which training steps are timed: each with a chance (by ``draw``) that makes one about
    each ``every`` seconds at the steps' pace so far (by ``now``), standing for 1/chance steps,
    so that the sum of the waits timed, so weighted, is the sum of all (whichever steps wait)."""

    def __init__(
        self,
        every: float,
        now: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.every, self.now, self.draw = every, now, draw
        self.pace = 0.0  # seconds a step, a running mean
        self.last: float | None = None  # when the last step began

    def step(self) -> float:
        """A training step begins: the steps its wait stands for if it is timed; else 0."""
        now = self.now()
        if self.last is not None:
            between = now - self.last
            self.pace = between if not self.pace else self.pace + (between - self.pace) / 16
        self.last = now
        chance = min(1.0, self.pace / self.every) if self.every > 0 and self.pace > 0 else 1.0
        if chance < 1.0 and self.draw() >= chance:
            return 0.0
        return 1.0 / chance


class BackwardWait:
    """The wait at the end of a DDP model's backward, from the end of its computation to the end
    of the reducer's wait for every bucket, marked by ``clock`` on the steps ``sampler`` chooses.

    Both ends are callbacks of the autograd engine, which runs a backward's callbacks once its
    graph is done, in the order queued, also those queued while they run. The first is queued
    when ``parameter``'s gradient is accumulated: before DDP's own (queued once its last bucket is
    ready, in a hook that runs after this one where ``parameter`` is the last). It is queued only
    by a backward that accumulates the parameters' gradients (not by ``autograd.grad``), and in
    the nested backward of reentrant checkpointing, where DDP's wait then is. The second is queued
    from the first: after DDP's, which waits for every bucket (on a GPU, queues the wait on the
    current stream)."""

    def __init__(self, clock: HostClock | DeviceClock, sampler: Sampler, parameter: Any) -> None:
        self.clock, self.sampler = clock, sampler
        self.armed: list[float] = []  # the weight of the step being timed, until its hook ran
        self.hook = parameter.register_post_accumulate_grad_hook(self._accumulated)

    def before_step(self) -> None:
        """A training forward begins: its backward is timed if the sampler says (a step chosen
        whose backward never came is not timed: an eval forward, two forwards a backward)."""
        self.armed.clear()
        weight = self.sampler.step()
        if weight:
            self.armed.append(weight)

    def forget(self) -> None:
        """Time no more (the model is timed anew)."""
        self.hook.remove()
        self.armed.clear()

    def _accumulated(self, _parameter: Any) -> None:
        """The parameter's gradient was accumulated (each backward; the first after the step
        was chosen ends its sample)."""
        if self.armed:
            _mark(lambda: _queue(functools.partial(self._computed, self.armed.pop())))  # pop: once

    def _computed(self, weight: float) -> None:
        start = _mark(self.clock.begin)
        if start is not None:
            _queue(functools.partial(self._waited, start, weight))

    def _waited(self, start: Any, weight: float) -> None:
        _mark(lambda: self.clock.end(start, weight))


def _queue(callback: Callable[[], None]) -> None:
    """Run ``callback`` once this backward's graph is done, after those queued before it (not
    at all if the engine refuses)."""
    _mark(lambda: _engine().queue_callback(callback))


class HostClock:
    """A wait's ends on the host's clock, its seconds (times the steps it stands for: its
    weight) added to this rank's waits at the end."""

    def begin(self) -> float:
        return time.perf_counter()

    def end(self, start: float, weight: float) -> None:
        collective_time.add((time.perf_counter() - start) * weight)


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

    def end(self, start: Any, weight: float) -> None:
        self.waits.end(start, self.stream(), weight)


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
