"""A stop that keeps the work: the first interrupt of a run whose ranks poll
``hvd_magic.stopping()`` asks them to stop at their next step boundary (they write a final
checkpoint and the run ends with rank 0's value); if they have not within ``GRACE_SECONDS``, or
at a second interrupt, the run is stopped at once, as any other run is at its first.

A preemption notice (the launcher's ``preempted``: Spark decommissioning an executor of the run;
or a rank's ``Noticed``: a cloud's notice read on its machine, ``rank.notices``)
asks the same of ranks that poll, with the notice as the reason; once they stopped, the run ends
in a ``RunError`` of class LOST, which ``retries=`` starts again from that checkpoint (with
``min_np=``, on the slots that are left): no step past the notice is lost.

While the run is supervised, the notebook's interrupt (SIGINT) is taken by a handler that only
counts it; the supervising loop raises it at its next ``check``. A ``KeyboardInterrupt`` raised
wherever the main thread happens to be (inside a lock of the kernel's output stream, of the
Spark client, of a widget's comm) can leave that lock held and the kernel hung for good; and
while a run is being stopped, interrupts are held back (``interrupts_deferred``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from hvd_magic.errors import FailureClass, RunError
from hvd_magic.protocol import Message, Noticed, Polling, StopAsked

if TYPE_CHECKING:
    from hvd_magic.run.checkpoint_store import CheckpointStore
    from hvd_magic.run.views import RunView

__all__ = ["GRACE_SECONDS", "GracefulStop", "interrupts_deferred"]

GRACE_SECONDS = 5.0
NOTICE_SECONDS = 1.0  # how often the launcher is asked for a preemption notice


class GracefulStop:
    def __init__(
        self,
        hub: Any,
        view: RunView,
        store: CheckpointStore | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub, self.view, self.store, self.clock = hub, view, store, clock
        self.preempted: str | None = None  # a notice the polling ranks were asked to stop for
        self.next_look = 0.0
        self.noticed: str | None = None  # a rank's own notice (a cloud's, on its machine)
        self.polls = False  # a rank called stopping(): this run can stop at a step boundary
        self.stopped = False  # and the ranks agreed to stop (not: ran to their end meanwhile)
        self.asked_at: float | None = None
        self.interrupts = self.raised = 0  # SIGINTs received, and raised as KeyboardInterrupt
        self.at_once = False  # asked to stop at once (the panel's "stop now"), not at a step boundary
        hub.taps[Polling] = self._polling
        hub.taps[Noticed] = self._noticed

    def _polling(self, message: Message) -> None:
        assert isinstance(message.record, Polling)
        self.polls = True
        self.stopped = self.stopped or message.record.stopping

    def _noticed(self, message: Message) -> None:
        assert isinstance(message.record, Noticed)
        self.noticed = self.noticed or f"rank {message.rank}: {message.record.text}"

    def supervise(self, supervise: Callable[[], Any]) -> Any:
        """Run ``supervise`` (a loop that calls ``check``); the first interrupt of a run that
        polls asks the ranks to stop."""
        if threading.current_thread() is not threading.main_thread():
            return self._supervise(supervise)  # no signal reaches another thread
        previous = signal.signal(signal.SIGINT, self._count)
        try:
            return self._supervise(supervise)
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)

    def _count(self, signum: int, frame: object) -> None:
        self.interrupts += 1

    def interrupt(self, at_once: bool = False) -> None:
        """As the notebook's interrupt, from any thread (the Horovod panel's stop): counted, and
        raised by the supervising loop at its next ``check``; ``at_once``: as a second interrupt."""
        self.at_once = self.at_once or at_once
        self.interrupts += 1

    def _supervise(self, supervise: Callable[[], Any]) -> Any:
        while True:
            try:
                value = supervise()
            except KeyboardInterrupt:
                if self.asked_at is not None or not self.polls or self.at_once:
                    raise
                self.asked_at = self.clock()
                self.hub.tell_all(StopAsked())
                self.view.notice(
                    "stopping at the next step boundary: the ranks write a final checkpoint and the cell "
                    f"returns rank 0's value (interrupt again to stop at once; at once anyway after "
                    f"{GRACE_SECONDS:.0f} s)"
                )
                continue
            if self.preempted is not None and not self.stopped:  # the cell ran to its end first
                self.view.notice(
                    f"preemption notice: {self.preempted}: the run ended before its ranks stopped"
                )
            elif self.preempted is not None:
                error = RunError(
                    f"preempted: {self.preempted}: the ranks stopped{self._where() or ' (no checkpoint)'}"
                )
                error.failure = FailureClass.LOST  # retried: from that checkpoint
                raise error
            if self.asked_at is not None:
                self.view.notice(f"stopped on request{self._where()}")
            return value

    def _where(self) -> str:
        """Where the ranks stopped: their last checkpoint (listed only when a stop was asked;
        kept after the run, though in a temporary folder: it is named)."""
        steps = self.store.steps() if self.store is not None else []
        if self.store is not None and steps:
            self.store.named = True
        return (
            f" at step {steps[-1]:,}; its checkpoint is in {self.store.target}"
            if self.store and steps
            else ""
        )

    def check(self, now: float, notices: Callable[[], str | None] = lambda: None) -> None:
        """An interrupt received since the last check, raised here; past the grace after a
        stop was asked: stop at once. ``notices``: the launcher's preemption notice, if any (not
        kept: the hub's taps hold this object, and a launcher they held would outlive its run)."""
        if self.interrupts > self.raised:
            self.raised = self.interrupts
            raise KeyboardInterrupt
        if self.asked_at is not None and now - self.asked_at > GRACE_SECONDS:
            raise KeyboardInterrupt
        if self.preempted is None and self.asked_at is None and now >= self.next_look:
            self.next_look = now + NOTICE_SECONDS
            notice = self.noticed or notices()
            if notice is not None and self.polls:
                self.preempted = notice
                self.hub.tell_all(StopAsked(notice))
                self.view.notice(
                    f"hvd_magic: preemption notice: {notice}: the ranks write a checkpoint at their next "
                    "step boundary and stop; with retries= the run starts again from it"
                )


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT (the notebook's interrupt) back while the block runs; the stop is bounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
