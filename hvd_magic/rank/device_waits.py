"""Waits that happen on a device, timed by pairs of its events (rank side; see ``collective_time``).

On a GPU the host only queues work: NCCL's allreduce waits for the other ranks inside a kernel,
and the host learns of it, if at all, at its next synchronisation. So the wait is timed where it
happens, on the device's stream: an event recorded before the collective and one recorded once
its result is there. Reading the time between them never blocks: a pair counts once its second
event has completed (``query``), at the next read (the rank's next ``report``), so the figure
lags the device by at most the steps still queued. Pairs are also settled as new ones come, so
a rank that never reports keeps only the pairs still in flight. Events read are made again
(recorded anew) rather than made afresh each step.

``Event`` is the part of ``torch.cuda.Event`` used here (``torch.cuda.Event(enable_timing=True)``
makes one); tests give events of their own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["DeviceWaits", "Event"]


class Event(Protocol):
    def record(self, stream: Any = None) -> None:
        """Mark the point ``stream`` (the device's current one if None) has reached: queued,
        not waited for."""

    def query(self) -> bool:
        """Whether the device has passed the mark (never blocks)."""

    def elapsed_time(self, end: Any, /) -> float:  # Any: an event of the same kind
        """Milliseconds from this mark to ``end`` on the device (both passed)."""


class DeviceWaits:
    """Seconds spent on a device between ``begin`` and ``end`` marks, summed as they complete."""

    def __init__(self, make_event: Callable[[], Event]) -> None:
        self._make_event = make_event
        self._pending: deque[tuple[Event, Event]] = deque()
        self._spare: list[Event] = []  # events read, to record again
        self._seconds = 0.0
        self._lock = threading.Lock()  # marks come from DDP's threads, reads from the step's

    def begin(self, stream: Any = None) -> Event:
        """Mark the start of a wait on ``stream`` (the current one if None)."""
        start = self._event()
        start.record(stream)
        return start

    def end(self, start: Event, stream: Any = None) -> None:
        """Mark its end on ``stream``, one that follows the collective's result (the current
        one if None)."""
        stop = self._event()
        stop.record(stream)
        with self._lock:
            self._pending.append((start, stop))
            self._settle()

    def __call__(self) -> float:
        """Seconds of the waits whose end the device has passed; a source for ``collective_time``."""
        with self._lock:
            self._settle()
            return self._seconds

    def in_flight(self) -> int:
        """Waits marked whose end the device has not passed yet (as last seen)."""
        with self._lock:
            return len(self._pending)

    def _event(self) -> Event:
        with self._lock:
            if self._spare:
                return self._spare.pop()
        return self._make_event()

    def _settle(self) -> None:
        while self._pending:
            start, stop = self._pending[0]
            try:
                if not stop.query():
                    return
                waited = start.elapsed_time(stop) / 1000.0
                self._spare += (start, stop)
            except Exception:  # noqa: BLE001 - a pair that cannot be read is dropped, not kept
                waited = 0.0
            self._pending.popleft()
            self._seconds += waited
