"""A rank's steps per second, as the live view shows it and the straggler watch judges it (pure).

The rate is measured on the rank's own clock (each report's ``t``), smoothed; shown at a moment
of the notebook's clock, it never exceeds one report's steps (those its last report moved on by:
1, or 100 where it reports every 100 steps) in the time since the last step came, so a rank that
reports nothing (it waits in a collective, or is stuck) decays rather than showing its last rate
for ever.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepRate"]

SMOOTHING = 0.2  # weight of the newest instant rate


@dataclass
class StepRate:
    rate: float | None = None  # steps per second, smoothed
    step: int | None = None
    seen: float | None = None  # when (the notebook's clock) the step last grew
    _last: tuple[float, int] | None = None  # (the rank's time, step) of the last report
    _moved: int = 1  # the steps the last report moved on by

    def add(self, step: int, sent: float, now: float) -> None:
        """Step ``step`` reported at ``sent`` (the rank's clock), arrived at ``now`` (ours)."""
        if self._last is not None and sent > self._last[0] and step > self._last[1]:
            instant = (step - self._last[1]) / (sent - self._last[0])
            self.rate = instant if self.rate is None else (1 - SMOOTHING) * self.rate + SMOOTHING * instant
            self._moved = step - self._last[1]
        self._last = (sent, step)
        if self.step is None or step > self.step:
            self.seen = now
        self.step = step

    def at(self, now: float) -> float | None:
        """The rate as shown at ``now``: at most one report's steps in the time since the last."""
        if self.rate is None or self.seen is None:
            return self.rate
        quiet = now - self.seen
        return min(self.rate, self._moved / quiet) if quiet > 0 else self.rate
