"""``min_np=M``: after a loss, a run with retries goes on with the slots there are instead of
waiting for all ``np``, and grows back to ``np`` at its next checkpoint once they return.

Each size is an attempt's: the ranks start again from the latest checkpoint with ``hvd.size()``
(or the world size) the new size, and ``data=`` split again for it. A shrink happens when the
next attempt starts and all np slots are not there within ``resize_wait``. A grow happens when a
checkpoint lands in a smaller run and the cluster has np slots again: the run stops there
(``SlotsBack``) and starts again at np from that checkpoint, so no step before it is lost. The
ranks learn it from ``hvd_magic.resized()`` (``HVD_MAGIC_RESIZED``: "old,new"), and every
attempt after the first its number (``HVD_MAGIC_ATTEMPT``). Slots are
counted where a cluster says (Spark classic); elsewhere a run keeps its np.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable

from hvd_magic.launch.spark_session import slots_within
from hvd_magic.options import RunOptions
from hvd_magic.protocol import ENV_ATTEMPT, ENV_RESIZED, ENV_RUN
from hvd_magic.run.checkpoint_store import CheckpointStore
from hvd_magic.run.views import RunView

__all__ = ["SLOT_POLL_SECONDS", "Sizes", "Slots", "SlotsBack"]

SLOT_POLL_SECONDS = 2.0
Slots = Callable[[RunOptions], "int | None"]  # the ranks that could run at once now; None: not told


class SlotsBack(Exception):  # noqa: N818 - not an error: how a smaller run hands over to a full one
    """A smaller run stops at the checkpoint just kept: the cluster has np slots again."""


class Sizes:
    """The options of each attempt of a run: its size with ``min_np``, the notices that say each
    change, and in its ranks' environment the run's id (``HVD_MAGIC_RUN``, in every attempt)
    and the attempt's number (after the first)."""

    def __init__(self, options: RunOptions, view: RunView, store: CheckpointStore, slots: Slots) -> None:
        options = dataclasses.replace(options, env={**options.env, ENV_RUN: uuid.uuid4().hex})
        self.options, self.view, self.store, self.slots = options, view, store, slots
        if store.given and (before := store.steps()):  # an earlier run's: they outrank this one's
            view.notice(
                f"hvd_magic: checkpoint_dir={store.target} holds checkpoints from before this run (steps "
                f"{', '.join(map(str, before))}): hvd_magic.resume() returns the latest, and one of this "
                f"run's of a lower step is not kept there (it keeps the {store.keep} highest): give a new "
                "run a folder of its own"
            )
        self.current = options
        self.changes: list[str] = []  # "4 → 3 ranks: ...", for the run's last line
        self.attempt = 1

    def next(self, why: str) -> RunOptions:
        """The next attempt's options (``why``: what ended the last), resized when it must be."""
        full, before = self.options.ranks, self.current.ranks
        size = self._size()
        self.attempt += 1
        env = dict(self.options.env) | {ENV_ATTEMPT: str(self.attempt)}  # a trainer resumes (rank.trainers)
        if size != before:
            env[ENV_RESIZED] = f"{before},{size}"
            steps = self.store.steps()
            start = f"from {self.options.checkpoint_unit} {steps[-1]:,}" if steps else "from the start"
            if size < before:
                reason = f"{why}; {full} slots were not there within {self.options.resize_wait:g} s"
            else:
                reason = "the cluster has the slots again"
            self.changes.append(f"{before} → {size} ranks: {reason}, {start}")
            self.view.notice(f"hvd_magic: {self.changes[-1]}")
        self.current = dataclasses.replace(self.options, np=size if self.options.np > 0 else -size, env=env)
        return self.current

    def _size(self) -> int:
        full, fewest = self.options.ranks, self.options.min_np
        if fewest is None:
            return full
        there = self._slots_within(full, time.monotonic() + self.options.resize_wait, SLOT_POLL_SECONDS)
        if there is None or there >= full:
            return full
        return there if there >= fewest else full  # fewer than min_np: wait for np, as without

    def _slots_within(self, need: int, deadline: float, poll: float) -> int | None:
        return slots_within(lambda: self.slots(self.options), need, deadline, poll)

    def wait_for_slots(self, deadline: float, poll: float = SLOT_POLL_SECONDS) -> None:
        """Until the cluster has the slots this attempt needs, or until ``deadline`` (monotonic):
        after a loss, a lost executor or a host's worker takes a while to come back, and the
        launcher would otherwise refuse the attempt for want of slots. Says once that it waits;
        a cluster that does not tell its slots is not waited for."""
        need = self.current.ranks
        there = self.slots(self.options)
        if there is None or there >= need or time.monotonic() >= deadline:
            return
        left = deadline - time.monotonic()
        said = f"waiting up to {left:.0f} s for {need} slots (the cluster has {there} now)"
        self.view.notice(f"hvd_magic: {said}")
        time.sleep(poll)
        self._slots_within(need, deadline, poll)

    def grow_check(self) -> Callable[[], bool] | None:
        """For a smaller run: whether to stop now, to grow (asked after each of its messages,
        it counts the slots only when a new checkpoint has landed)."""
        if self.current.ranks >= self.options.ranks:
            return None
        seen = self.store.last_landed

        def slots_back() -> bool:
            nonlocal seen
            if self.store.last_landed == seen:
                return False
            seen = self.store.last_landed
            there = self.slots(self.options)
            return there is not None and there >= self.options.ranks

        return slots_back
