"""What timing a rank's waits costs its steps, measured in the rank, and the limit on it (rank
side; see ``collective_time``, ``collective_ddp``).

Timing DDP's wait adds work to every training step: Python inside the backward and, on a GPU,
two CUDA events. On an H200 that cost a 1.4 ms step 8.7 %, mostly in the events, and not where a
clock around the timing's own code could see it (a hook's call into Python, an event's effect on
the launches after it). So the cost is measured as ``bench/stragglers.py`` measures it: after
``WARM_UP_STEPS`` timed steps, ``PROBE_STEPS`` more, timed and not in turn (blocks of four, ABBA),
each step's time read at its model's next training forward. Where clearly more than half the
blocks (``measure_cost``) find the timed steps longer by over the limit (1 % of the untimed step,
``HVD_MAGIC_TIMING_LIMIT``), the timing is off for the rest of the rank's life and the rank tells
the notebook once (``TimingOff``); else it goes on as before. One probe a model, never repeated.

While the probe runs the rank sends no waits (``collective_time.hold``): half its steps are not
timed, and a figure short of their waits would make it look slow (the reason sampling steps was
taken back, docs/stragglers.md); the straggler watch judges every rank by wall time while one
sends none. Steps of ``LONG_STEP`` or more are not probed (the timing's cost, some tens to
hundreds of microseconds a step, cannot be 1 % of them), and a probe lasts ``PROBE_SECONDS`` at
most (with fewer than ``MIN_BLOCKS`` blocks by then, the timing stays on).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hvd_magic.protocol import ENV_TIMING_LIMIT, TimingOff
from hvd_magic.protocol.env import TIMING_LIMIT, parse_timing_limit
from hvd_magic.rank import collective_time, reporting

__all__ = ["Cost", "CostProbe", "LimitedSteps", "measure_cost", "timing_limit"]

WARM_UP_STEPS = 30  # first steps are slow (allocators, kernels chosen): not probed
PROBE_STEPS = 200  # 50 blocks of four: timed, untimed, untimed, timed
PROBE_SECONDS = 10.0  # the most a probe holds the rank's figure back
MIN_BLOCKS = 5  # blocks a probe cut short by PROBE_SECONDS needs to judge
LONG_STEP = 0.1  # seconds: a warm-up whose median step is this long is not probed
SURE = 2.0  # standard deviations of a fair coin the blocks over the limit must clear half by
_ABBA = (True, False, False, True)


@dataclass(frozen=True)
class Cost:
    """A timed step's ``added`` seconds over an untimed ``step`` (medians); ``over`` of the
    probe's ``blocks`` found it over the limit."""

    added: float
    step: float
    blocks: int
    over: int

    @property
    def share(self) -> float:
        return self.added / self.step if self.step > 0 else 0.0

    @property
    def clearly_over(self) -> bool:
        """Whether more blocks found it over the limit than a coin would, beyond doubt."""
        return self.over > self.blocks / 2 + SURE * math.sqrt(self.blocks) / 2


def measure_cost(probed: Sequence[float], limit: float) -> Cost:
    """What timing cost, from the seconds of a probe's steps, in ``_ABBA`` order. Each block of
    four compares the faster of its timed steps with the faster of its untimed ones (drift
    weighs on both kinds alike, and other work only ever slows a step: the faster of two is
    more often the step's own time); it is over the limit where the timed took longer by over
    ``limit`` of the median untimed step. Counting blocks (a sign test) rather than comparing
    means keeps the steps another process slowed from deciding."""
    untimed = [seconds for i, seconds in enumerate(probed) if not _ABBA[i % len(_ABBA)]]
    step = statistics.median(untimed)
    blocks = zip(*[iter(probed)] * len(_ABBA), strict=False)
    added = [min(a, d) - min(b, c) for a, b, c, d in blocks]
    over = sum(1 for seconds in added if seconds > limit * step)
    return Cost(statistics.median(added), step, len(added), over)


class CostProbe:
    """One model's training steps (pure): ``step(now)`` at each says whether to time it; once
    ``done``, ``cost`` is what timing cost (None: not probed, or too few steps)."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.steps = 0
        self.warm: list[float] = []  # the warm-up's step times
        self.probed: list[float] = []  # the probe's, in _ABBA order
        self.until: float | None = None  # while probing: when it ends at the latest
        self.done = False
        self.cost: Cost | None = None
        self._began: float | None = None  # when the last step began

    @property
    def probing(self) -> bool:
        return self.until is not None and not self.done

    @property
    def over(self) -> bool:
        """Decided: timing costs over the limit."""
        return self.done and self.cost is not None and self.cost.clearly_over

    def step(self, now: float) -> bool:
        """A training step begins at ``now``: whether to time it."""
        if self.done:
            return True
        if self._began is not None:
            (self.probed if self.probing else self.warm).append(now - self._began)
        self._began = now
        self.steps += 1
        if self.until is None and self.steps > WARM_UP_STEPS:
            self._begin(now)
        elif self.until is not None:
            self._end(now, self.until)
        return not self.probing or _ABBA[len(self.probed) % len(_ABBA)]

    def _begin(self, now: float) -> None:
        if self.warm and statistics.median(self.warm) >= LONG_STEP:
            self.done = True
        else:
            self.until = now + PROBE_SECONDS

    def _end(self, now: float, until: float) -> None:
        if len(self.probed) < PROBE_STEPS and now < until:
            return
        self.done = True
        if len(self.probed) >= MIN_BLOCKS * len(_ABBA):
            self.cost = measure_cost(self.probed, self.limit)


def timing_limit() -> float | None:
    """This rank's limit (``HVD_MAGIC_TIMING_LIMIT``; the default where it is misspelled)."""
    try:
        return parse_timing_limit(os.environ.get(ENV_TIMING_LIMIT))
    except ValueError:
        return TIMING_LIMIT  # the notebook checked it: set in the rank by hand


class LimitedSteps:
    """A timed model's training steps under the limit: holds the rank's figure while its probe
    runs, then lets it go on, or calls ``stop`` (time nothing more) and tells the notebook once."""

    def __init__(
        self, limit: float, stop: Callable[[], None], clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.probe, self.stop, self.clock = CostProbe(limit), stop, clock

    def step(self) -> bool:
        """A training step begins: whether to time it."""
        probe = self.probe
        was = probe.probing
        timed = probe.step(self.clock())
        if probe.probing and not was:
            collective_time.hold(self, PROBE_SECONDS + 1.0)  # the probe ends first, at its next step
        elif was and not probe.probing:
            collective_time.end_hold(self)
            if probe.over:
                self._switch_off()
        return timed

    def forget(self) -> None:
        """Its model is gone: hold nothing back."""
        collective_time.end_hold(self)

    def _switch_off(self) -> None:
        said = not collective_time.is_off()  # on: the straggler watch judged by these waits
        collective_time.switch_off()
        self.stop()
        reporter, cost = reporting.current(), self.probe.cost
        if said and reporter is not None and cost is not None:
            reporter.client.send(TimingOff(cost.share, cost.step, self.probe.limit))
