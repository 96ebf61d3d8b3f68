"""The ranks' ``Reports`` as scalar points (pure): each rank's value as it arrives, and the mean
across ranks at each step.

A step's mean is known once every rank reported that metric at that step. A metric only some
ranks report (``if hvd.rank() == 0: report(val_acc=...)``) never gets there: its step's mean is
taken over the ranks that did, ``GRACE_SECONDS`` after the first of them (ranks in step report
within a flush or two of each other, 0.1 s apart), or when the run ends. A value that comes
after its step's mean was written (a rank more than the grace behind) is that rank's point
only: a step has one mean in an attempt. A metric reported without a step belongs to the rank's current
step, as in the live view.

A run that starts again (``retries=``; on another number of ranks with ``min_np=``) is seen by
its ranks' ``Started``: a rank that starts a second time, or on another size, begins the next
attempt. The steps the last attempt left without every rank's value get their means then, over
the ranks that reported, and the next steps' means wait for the new attempt's ranks: one that
resumed from a checkpoint reports steps again, and they get their means again, over every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hvd_magic.protocol import Message, Reports, Started

__all__ = ["GRACE_SECONDS", "Point", "Scalars"]

GRACE_SECONDS = 10.0
LATE_LIMIT = 10_000  # steps whose mean was written without some ranks, remembered for their values


@dataclass(frozen=True)
class Point:
    """One value of a metric at a step; ``rank`` None is the mean across the ranks."""

    name: str
    step: int
    value: float
    wall_time: float  # seconds since the epoch, when the (last) rank reported it
    rank: int | None = None


@dataclass
class _Pending:
    arrived: float  # the run's clock, when the first rank's value came
    wall_time: float
    values: dict[int, float] = field(default_factory=dict)


class Scalars:
    """Folds ``Reports`` messages of ``ranks`` ranks into points."""

    def __init__(self, ranks: int, grace: float = GRACE_SECONDS) -> None:
        self.ranks, self.grace = ranks, grace
        self._step: dict[int, int] = {}  # rank -> its latest step
        self._count: dict[int, int] = {}  # rank -> its records: the x of metrics never given a step
        self._pending: dict[tuple[str, int], _Pending] = {}  # (metric, step), oldest first
        self._late: dict[tuple[str, int], set[int]] = {}  # written without these ranks, oldest first
        self._started: set[int] = set()  # the ranks of this attempt that said they started

    def take(self, message: Message, now: float) -> list[Point]:
        """The points in ``message`` (arrived at ``now``, the run's clock), and the means that
        are complete or waited past the grace."""
        points: list[Point] = []
        if isinstance(message.record, Started):
            points += self._started_on(message.rank, message.record.size)
        if isinstance(message.record, Reports) and 0 <= message.rank < self.ranks:
            for record in message.reports:
                points += self._fold(message.rank, record, now)
        return points + self._overdue(now)

    def rest(self) -> list[Point]:
        """At the end: the means of the steps not every rank reported, over those that did."""
        points = [self._mean(key, pending) for key, pending in self._pending.items()]
        self._pending.clear()
        return points

    def _started_on(self, rank: int, size: int) -> list[Point]:
        """Rank ``rank`` started, one of ``size``: a new attempt where it had started already or
        the size changed (the last attempt's steps then get their means, over who reported)."""
        points = []
        if rank in self._started or size != self.ranks:
            points = self.rest()
            self._started.clear()
            self._late.clear()  # a resumed attempt reports those steps again, every rank of it
            self._step.clear()
            self.ranks = size
        self._started.add(rank)
        return points

    def _fold(self, rank: int, record: dict[str, Any], now: float) -> list[Point]:
        self._count[rank] = self._count.get(rank, 0) + 1
        step = int(record.get("step", self._step.get(rank, self._count[rank])))
        if "step" in record:
            self._step[rank] = step
        wall_time = float(record.get("t", 0.0))
        points = []
        for name, value in record.get("metrics", {}).items():
            points.append(Point(name, step, float(value), wall_time, rank))
            if self._arrived_late((name, step), rank):
                continue
            pending = self._pending.setdefault((name, step), _Pending(now, wall_time))
            pending.values[rank] = float(value)
            pending.wall_time = max(pending.wall_time, wall_time)
            if len(pending.values) == self.ranks:
                points.append(self._mean((name, step), self._pending.pop((name, step))))
        return points

    def _overdue(self, now: float) -> list[Point]:
        points = []
        while self._pending:
            key, pending = next(iter(self._pending.items()))
            if now - pending.arrived < self.grace:
                break
            pending = self._pending.pop(key)
            points.append(self._mean(key, pending))
            self._late[key] = set(range(self.ranks)) - set(pending.values)
            if len(self._late) > LATE_LIMIT:
                del self._late[next(iter(self._late))]
        return points

    def _arrived_late(self, key: tuple[str, int], rank: int) -> bool:
        missing = self._late.get(key)
        if missing is None or rank not in missing:
            return False
        missing.discard(rank)
        if not missing:
            del self._late[key]
        return True

    @staticmethod
    def _mean(key: tuple[str, int], pending: _Pending) -> Point:
        values = pending.values.values()
        return Point(key[0], key[1], sum(values) / len(values), pending.wall_time)
