"""DDP's waits, timed (torch.distributed ranks; see ``collective_time``).

DDP's reducer waits in C++, at the end of ``backward``, for the allreduce of its last buckets of
gradients. That wait is timed from the autograd engine (``BackwardWait``): from the end of the
backward's computation (DDP has launched its last bucket) to the end of the reducer's wait for
every bucket. DDP's own C++ allreduce, or the user's communication hook, stays as it is. The
two ends are marked

- on the CPU, on the host's clock (the reducer's wait blocks the host);
- on a CUDA GPU, by two CUDA events on the stream the reducer's wait is queued on
  (``device_waits``: NCCL waits inside a kernel, and the host does not see it).

Not every step is timed: one at most every ``SAMPLE_SECONDS`` (``Sampler``), its wait counted
for the steps since the last one timed. On an H200, with a 1.2 ms step, marking every step cost
about 20 us in Python (a hook and two callbacks) and 70 us for each CUDA event recorded from the
backward (measured, not explained); a step timed ten times a second costs a thousandth of that,
and a step not timed one Python call in its forward (the sampler's).
"""

from __future__ import annotations

import functools
import math
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
SAMPLE_SECONDS = 0.1  # a step's wait is timed at most this often
# The DDP models whose timing was tried: their BackwardWait, or None where not timed. Kept here,
# not on the model, so that a model pickles and copies as DDP does (a copy is timed anew).
_tried: weakref.WeakKeyDictionary[Any, BackwardWait | None] = weakref.WeakKeyDictionary()
_MOST_OUTPUTS = 8  # a timed step's backward is noticed at the first of these outputs' gradients
_device_waits: DeviceWaits | None = None  # this process's CUDA waits, once a model on a GPU is timed
_counted = False  # they are a source of collective_time's


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
            time_model(self)
        output = forward(self, *args, **kwargs)
        wait = _tried.get(self) if training else None
        if wait is not None:
            wait.forward(output)
        return output

    ddp._hvd_magic_timed = True
    ddp.forward = functools.wraps(forward)(forward_hooked)


def time_model(model: Any, every: float = SAMPLE_SECONDS) -> None:
    """Time this DDP model's waits from its next training forward on (``time_ddp`` must be in
    place), as its first training forward in a rank does: on the host's clock on the CPU, by
    CUDA events on a CUDA GPU, not at all on other devices; a step at most each ``every``
    seconds."""
    _tried[model] = None  # tried once, whatever comes of it
    if model.device_type == "cpu":
        time_on_host(model, every)
    elif model.device_type == "cuda":
        time_on_device(model, _cuda_waits(), every)


def time_on_host(model: Any, every: float = SAMPLE_SECONDS) -> None:
    """Time ``model``'s waits on the host's clock."""
    _time(model, HostClock(), every)


def time_on_device(model: Any, waits: DeviceWaits, every: float = SAMPLE_SECONDS) -> None:
    """Time ``model``'s waits by events of its device (``waits`` makes them), counted as this
    rank's once the model is timed. A model on the CPU has no stream: its events are recorded
    with none (the tests' events)."""
    _time(model, DeviceClock(waits, next(model.module.parameters()).device), every)
    _count(waits)


def _time(model: Any, clock: HostClock | DeviceClock, every: float) -> None:
    _tried[model] = BackwardWait(clock, Sampler(every))
    collective_time.measured()


class Sampler:
    """Which training steps are timed: one at most each ``every`` seconds (by ``now``), standing
    for itself and the steps since the last one timed (its weight)."""

    def __init__(self, every: float, now: Callable[[], float] = time.monotonic) -> None:
        self.every, self.now = every, now
        self.steps = 0  # since the last step timed
        self.last = -math.inf

    def step(self) -> int:
        """A training step begins: the steps its wait stands for, if it is timed; else 0."""
        self.steps += 1
        now = self.now()
        if now - self.last < self.every:
            return 0
        weight, self.steps, self.last = self.steps, 0, now
        return weight

    def missed(self, weight: int) -> None:
        """A step meant to be timed was not: the next one is, for these steps too."""
        self.steps += weight
        self.last = -math.inf


class BackwardWait:
    """The wait at the end of a DDP model's backward, from the end of its computation to the end
    of the reducer's wait for every bucket, marked by ``clock`` on the steps ``sampler`` chooses.

    Both ends are callbacks of the autograd engine, which runs a backward's callbacks once its
    graph is done, in the order queued, also those queued while they run. The first is queued at
    the gradient of the model's output: before DDP's own (queued once its last bucket of
    parameters' gradients was ready). The second is queued from the first: after DDP's, which
    waits for every bucket (on a GPU, queues the wait on the current stream)."""

    def __init__(self, clock: HostClock | DeviceClock, sampler: Sampler) -> None:
        self.clock, self.sampler = clock, sampler

    def forward(self, output: Any) -> None:
        """A training forward returned ``output``: its backward is timed if the sampler says."""
        weight = self.sampler.step()
        if not weight:
            return
        outputs: list[Any] = []
        _with_gradient(output, outputs)
        if not outputs:
            self.sampler.missed(weight)
            return
        noticed = functools.partial(self._backward, [weight])
        for tensor in outputs:
            _mark(functools.partial(tensor.register_hook, noticed))

    def _backward(self, weight: list[int], _gradient: Any) -> None:
        """The backward reached an output (the first of them ends the sample's wait for one)."""
        if weight:
            _queue(functools.partial(self._computed, weight.pop()))

    def _computed(self, steps: int) -> None:
        start = _mark(self.clock.begin)
        if start is not None:
            _queue(functools.partial(self._waited, start, steps))

    def _waited(self, start: Any, steps: int) -> None:
        _mark(lambda: self.clock.end(start, steps))


def _queue(callback: Callable[[], None]) -> None:
    """Run ``callback`` once this backward's graph is done, after those queued before it (not
    at all if the engine refuses)."""
    _mark(lambda: _engine().queue_callback(callback))


def _with_gradient(value: Any, found: list[Any]) -> None:
    """The tensors in a model's output (tensors, lists, tuples, dicts of them) that a backward
    may reach, up to ``_MOST_OUTPUTS``."""
    if len(found) >= _MOST_OUTPUTS:
        return
    if getattr(value, "grad_fn", None) is not None:
        found.append(value)
    elif isinstance(value, list | tuple):
        for item in value:
            _with_gradient(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _with_gradient(item, found)


class HostClock:
    """A wait's ends on the host's clock, its seconds (times the steps it stands for) added to
    this rank's waits at the end."""

    def begin(self) -> float:
        return time.perf_counter()

    def end(self, start: float, steps: int) -> None:
        collective_time.add((time.perf_counter() - start) * steps)


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

    def end(self, start: Any, steps: int) -> None:
        self.waits.end(start, self.stream(), steps)


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
