"""``retries=N``: a run that lost a rank to something outside the user's code starts again, on
whatever slots Spark gives, and its code resumes from the latest checkpoint
(``hvd_magic.resume()``). Which failure classes are retried, and why the others are not, is
``errors.FailureClass`` to say (``.retried``). Neither are an interrupt nor a run
that stopped making progress (``timeout=``).

The class and the words come with the error (``RunError.failure``, ``.cause``: the diagnosis
decides them once); ``Attempts`` keeps the causes, says each new attempt in the view, and waits
for slots when a lost executor has not come back yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hvd_magic.errors import LaunchError, RunError, RunInterrupted, RunTimeout
from hvd_magic.launch import Launcher
from hvd_magic.options import RunOptions
from hvd_magic.protocol import Message
from hvd_magic.run.checkpoint_store import CheckpointStore
from hvd_magic.run.resize import SLOT_POLL_SECONDS, Sizes, Slots, SlotsBack
from hvd_magic.run.views import RunView

__all__ = ["Attempts", "HeldView"]


class HeldView:
    """The view of a run with retries: shared by the attempts, closed once, after the last."""

    def __init__(self, view: RunView) -> None:
        self.view = view

    def notice(self, text: str) -> None:
        self.view.notice(text)

    def message(self, message: Message) -> None:
        self.view.message(message)

    def tick(self) -> None:
        self.view.tick()

    def close(self) -> None:
        pass


class Attempts:
    def __init__(
        self, options: RunOptions, view: RunView, store: CheckpointStore, slots: Slots = lambda options: None
    ) -> None:
        self.retries, self.view, self.store = options.retries, view, store
        self.unit = options.checkpoint_unit
        self.causes: list[str] = []
        self.sizes = Sizes(options, view, store, slots)
        self.again = False  # the last attempt ended to start again (a loss retried, or slots back)

    @property
    def options(self) -> RunOptions:
        """The next (or current) attempt's: its np is the run's, or the size min_np= chose."""
        return self.sizes.current

    def launcher(self, create: Callable[[RunOptions], Launcher], wait: float) -> Launcher:
        """A launcher for the next attempt; after a loss, wait up to ``wait`` seconds for the
        slots it needs (a lost executor takes a while to come back)."""
        deadline = time.monotonic() + wait
        if self.again:
            self.store.named = False  # the last attempt's stop named its folder: this one goes on from it
            self.sizes.next(self.causes[-1] if self.causes else "")
            self.again = False
            self.sizes.wait_for_slots(deadline)
        while True:
            try:
                return create(self.options)
            except LaunchError:
                if not self.causes or time.monotonic() > deadline:
                    raise
                time.sleep(SLOT_POLL_SECONDS)

    def interrupted(self) -> RunInterrupted:
        """An interrupt before this attempt's ranks started (while it waited for its slots)."""
        if self.sizes.attempt == 1:
            return RunInterrupted("interrupted before any rank started; nothing was launched.")
        earlier = "; ".join(f"{n}. {c}" for n, c in enumerate(self.causes, 1)) or "slots came back"
        return RunInterrupted(
            f"interrupted while attempt {self.sizes.attempt} waited for its slots; it was not launched "
            f"(earlier attempts: {earlier})."
        )

    def failed(self, error: BaseException) -> None:
        """Raise ``error`` unless the run may start again (its class, ``RunError.failure``, is
        retried and retries are left); else say so in the view."""
        self.again = True
        if isinstance(error, SlotsBack):  # not a failure: not counted against retries
            return
        found, ended = None, isinstance(error, (RunInterrupted, RunTimeout))  # stopped, not failed
        if isinstance(error, RunError) and not ended and error.failure is not None:
            found = (error.failure, error.cause or str(error).splitlines()[0])  # a preemption: no rank failed
        if found is None or not found[0].retried or len(self.causes) >= self.retries:
            if found is not None and not found[0].retried and len(self.causes) < self.retries:
                error.add_note(f"not retried ({found[0].value}): {found[0].why_not_retried}")
            if self.causes:
                last = f"{found[0].value}: {found[1]}" if found else str(error).splitlines()[0]
                tried = [*self.causes, last]
                error.add_note("attempts: " + "; ".join(f"{n}. {c}" for n, c in enumerate(tried, 1)))
            raise error
        failure, words = found
        self.causes.append(f"{failure.value}: {words}")
        steps = self.store.steps()
        start = f"from {self.unit} {steps[-1]:,}" if steps else "from the start (no checkpoint yet)"
        self.view.notice(f"{self.causes[-1]}: attempt {len(self.causes) + 1} of {self.retries + 1} {start}")

    def succeeded(self) -> None:
        if self.causes:
            earlier = "; ".join(f"{n}. {c}" for n, c in enumerate(self.causes, 1))
            self.view.notice(f"finished on attempt {len(self.causes) + 1} of {self.retries + 1} ({earlier})")
        if self.sizes.changes:
            self.view.notice(f"hvd_magic: resized: {'; '.join(self.sizes.changes)}")
