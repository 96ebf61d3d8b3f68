"""Keeping a long run's work from a rank: ``checkpoint``, ``resume`` and ``stopping``.

>>> state = hvd_magic.resume() or {"step": 0, "model": model.state_dict()}     # doctest: +SKIP
>>> model.load_state_dict(state["model"])
>>> for step in range(state["step"], steps):
...     train_step()
...     if step % 100 == 0:
...         hvd_magic.checkpoint({"step": step, "model": model.state_dict()}, step=step)
...     if hvd_magic.stopping():                      # every rank, at the same place
...         hvd_magic.checkpoint({"step": step, "model": model.state_dict()}, step=step)
...         break

Outside a run each is harmless: ``checkpoint`` returns False (a negative step is refused
everywhere), ``resume`` None, ``stopping`` False.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from hvd_magic.errors import CheckpointError
from hvd_magic.protocol import KeptRequest, Polling, ResumeAnswer, ResumeRequest
from hvd_magic.protocol.files import checkpoint_name
from hvd_magic.rank import inbox as rank_inbox
from hvd_magic.rank import reporting

__all__ = ["StoppingLate", "checkpoint", "resume", "stopping"]

RESUME_TIMEOUT = 300.0
KEPT_TIMEOUT = 300.0  # a checkpoint's last chunk sent, to kept (written, and copied to a URL)
_polling_told = False
_agreed = False  # the ranks agreed to stop: later calls say so without a collective, on every rank


def checkpoint(state: Any, step: int, wait: bool = False) -> bool:
    """On rank 0: send ``state`` (anything picklable: state_dicts, optimizer state, numbers) to
    the notebook, where it is kept whole (written, then renamed) in the run's checkpoint folder
    (``checkpoint_dir=``), the last 3 kept. Other ranks: nothing (False), so every rank may call
    it. A retried run's ranks find it with ``resume()``.

    It returns once the state is pickled and on its way: training goes on while it travels, and
    a rank killed meanwhile leaves the previous checkpoint the latest. ``wait=True`` returns once
    the notebook kept it (True), or False if it could not say so within 5 minutes: before a
    planned exit, or when a notice says the machine is about to go."""
    if int(step) < 0:
        raise CheckpointError(f"checkpoint(step={step}): a step is 0 or more (the latest is the highest)")
    reporter = reporting.current()
    if reporter is None or reporter.client.rank != 0:
        return False
    # pickled here (a snapshot: training may change the tensors next), sent in the background
    if not reporting.send_file_soon(checkpoint_name(int(step)), cloudpickle.dumps(state)):
        return False
    if not wait:
        return True
    reporter.files.join()  # every chunk queued on the connection, in order, before the question
    try:
        answer = reporter.client.ask(KeptRequest(0, int(step)), b"", KEPT_TIMEOUT)
    except TimeoutError:
        return False
    return bool(getattr(answer.record, "kept", False))


def resume() -> Any:
    """The latest checkpoint's state, on every rank; None on a fresh start (or outside a run)."""
    reporter = reporting.current()
    if reporter is None:
        return None
    answer = reporter.client.ask(ResumeRequest(0), b"", RESUME_TIMEOUT)
    if isinstance(answer.record, ResumeAnswer) and answer.record.error:
        raise CheckpointError(
            f"resume(): the notebook could not read the run's checkpoints: {answer.record.error}"
        )
    if not getattr(answer.record, "found", False):
        return None
    return cloudpickle.loads(answer.blob)


def stopping() -> bool:
    """Whether the notebook asked the run to stop (its first interrupt, or a preemption notice:
    Spark decommissioning an executor of the run, said on stderr). A collective: every
    rank calls it at the same place in its loop, and all get the same answer, so that no rank
    leaves a collective the others are in. Then write a final checkpoint and leave the loop;
    the cell returns rank 0's value."""
    asked = _asked()
    if asked is None or _agreed:
        return _agreed
    return _agree(_any_rank(asked))


class StoppingLate:
    """``stopping()`` for a trainer's callback, asked at every step and adding no wait to it.
    The ranks' OR of whether the run was asked to stop is an allreduce started in the
    background and read a few calls later, when the next starts: every rank starts and reads
    them at the same calls, so all agree on the step they stop at. With it each rank proposes
    how many calls apart the next should be (about ``EVERY_SECONDS`` of its steps, at most
    ``MOST_CALLS``) and the ranks take the fewest: a stop lands within about two such spans,
    and fast steps pay one small collective for many. Where torch.distributed is not
    initialized it is ``stopping()``."""

    EVERY_SECONDS = 0.05
    MOST_CALLS = 64

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._calls = 0
        self._next = 1  # the call that reads the allreduce in flight and starts the next
        self._pending: tuple[Any, Any] | None = None  # that allreduce, and its tensor
        self._started: tuple[int, float] = (0, 0.0)  # the call and the time it was started at

    def __call__(self) -> bool:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return stopping()
        asked = _asked()
        if asked is None or _agreed:
            return _agreed
        self._calls += 1
        if self._calls < self._next:
            return False
        now, interval = self._clock(), 1
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            stop, fewest = flag.tolist()
            if stop > 0:
                return _agree(True)
            interval = max(1, int(-fewest))
        flag = _flag(dist, [float(asked), -float(self._proposed(now))])  # MAX: [any, -the fewest]
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        self._started, self._next = (self._calls, now), self._calls + interval
        return False

    def _proposed(self, now: float) -> int:
        """How many calls apart this rank would have the next allreduces: about EVERY_SECONDS
        of its calls since the last (1 before it knows)."""
        call, then = self._started
        per_call = (now - then) / (self._calls - call) if call else 0.0
        calls = 1 if per_call <= 0 else math.ceil(self.EVERY_SECONDS / per_call)
        return min(max(calls, 1), self.MOST_CALLS)


def new_cell() -> None:
    """A live session's next cell stops on its own: the last cell's agreed stop, the stop it
    was asked, and the notebook's having heard that it polls were that cell's (every later
    cell stopped at its first ``stopping()``, and its first interrupt could not ask the ranks)."""
    global _polling_told, _agreed
    _polling_told = _agreed = False
    inbox = rank_inbox.current()
    if inbox is not None:
        inbox.stop_asked.clear()
        inbox.stop_reason = ""


def _asked() -> bool | None:
    """Whether this rank was asked to stop (None: not in a run); the notebook hears, once, that
    the ranks look (its first interrupt then asks them, rather than stopping them at once)."""
    global _polling_told
    inbox, reporter = rank_inbox.current(), reporting.current()
    if inbox is None or reporter is None:
        return None
    if not _polling_told:
        _polling_told = True
        reporter.client.send(Polling())
    return inbox.stop_asked.is_set()


def _agree(agreed: bool) -> bool:
    global _agreed
    _agreed = agreed
    inbox, reporter = rank_inbox.current(), reporting.current()
    if agreed and reporter is not None:
        reporter.client.send(Polling(stopping=True))  # the run ended for the stop, not at its end
    if agreed and inbox is not None and inbox.stop_reason:
        print(f"hvd_magic: stopping: {inbox.stop_reason}", file=sys.stderr, flush=True)
    return agreed


def _flag(dist: Any, values: bool | list[float]) -> Any:
    """``values`` as a tensor torch.distributed's backend reduces (NCCL: on the GPU)."""
    import torch

    on_gpu = dist.get_backend() == "nccl"
    numbers = [float(values)] if isinstance(values, bool) else values
    return torch.tensor(numbers, device=torch.cuda.current_device() if on_gpu else "cpu")


def _any_rank(flag: bool) -> bool:
    """``flag`` OR-ed over the ranks, with the framework the ranks run."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        import torch

        value = _flag(dist, flag)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        import torch

        return bool(hvd.allreduce(torch.tensor([float(flag)]), op=hvd.Max, name="hvd_magic.stopping").item())
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None and hvd.is_initialized():
        import tensorflow as tf

        return bool(hvd.allreduce(tf.constant([float(flag)]), op=hvd.Max, name="hvd_magic.stopping")[0])
    return flag
