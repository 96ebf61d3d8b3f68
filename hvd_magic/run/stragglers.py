"""Stragglers: a rank whose steps/s stays below a share of the ranks' median (pure).

``StragglerDetector`` judges rates at moments of the run's clock: a rank below
``rule.fraction`` of the median at every check for ``rule.seconds`` is named once, and cleared
once it has been back at or above the fraction for half that time (so a rank near the line is
not named and cleared over and over). ``StragglerWatch`` feeds it from the messages the run
receives anyway: each rank's steps (``report(step=...)``, the callbacks) through the live view's
own ``StepRate`` (a rank that reports nothing decays), its host (``Started``) and its resources
(``RankStatus``), which give the likely reason (``likely_reason``).

In lock-step training (an allreduce every step) every rank makes the same steps/s: the fast ones
wait for the slow one inside the collective. Where a rank measures its waits in collectives
(``collective_time``: Horovod's PyTorch binding; DDP, on the CPU and CUDA GPUs; Horovod's
TensorFlow gradients, on the CPU and GPUs), its steps are timed on its own clock, that time less its
waits, so the rank the others wait for is the slow one; elsewhere steps/s are judged by wall
time, which names ranks whose steps are their own (independent work, uneven
shards before a sync), and the stall watch names a rank the others wait on. Own clocks are only
compared with own clocks: while any rank sends no waits (none measured; its timing measuring what
it costs, or off because it cost too much: ``rank.timing_cost``) every rank is judged by wall
time, and a rank's own clock runs with the wall clock meanwhile (its waits as last sent).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from hvd_magic.options.straggler_rule import StragglerRule
from hvd_magic.protocol import Exit, Message, RankError, RankStatus, Reports, Started, Straggler
from hvd_magic.widgets.step_rate import StepRate

__all__ = ["Change", "StragglerDetector", "StragglerWatch", "likely_reason"]

REPORT_SLACK = 1.0  # seconds: rates are judged this far back (see StragglerWatch.check)
# ... and at most this often: a rank is named after seconds (``StragglerRule``), while a run's
# loop turns a hundred times a second under a flood of reports (64 ranks' in bench/live_view.py)
CHECK_SECONDS = 0.05
RECOVERY_SHARE = 0.5  # of rule.seconds a named rank must stay back at or above the fraction
CPU_SATURATED = 90.0  # percent of the host's CPUs, or of the rank's own cores
GPU_BUSY = 90.0  # percent utilisation
SWAPPING = 1 << 20  # bytes a second swapped in and out on its host


@dataclass(frozen=True)
class Change:
    """Rank ``rank`` was named (``named``) or cleared, at ``rate`` against the ``median``."""

    rank: int
    named: bool
    rate: float
    median: float


@dataclass
class _Watched:
    below_since: float | None = None
    above_since: float | None = None
    named: bool = False


class StragglerDetector:
    """The pure judge: ``check(now, rates)`` at each moment, the changes it brings."""

    def __init__(self, rule: StragglerRule) -> None:
        self.rule = rule
        self._ranks: dict[int, _Watched] = {}

    @property
    def named(self) -> set[int]:
        return {rank for rank, watched in self._ranks.items() if watched.named}

    def check(self, now: float, rates: Mapping[int, float]) -> list[Change]:
        """``rates``: the steps/s at ``now`` of the ranks still running that have one. A rank no
        longer among them (it finished) is forgotten; with fewer than two there is no median."""
        for rank in set(self._ranks) - set(rates):
            del self._ranks[rank]
        median = statistics.median(rates.values()) if len(rates) > 1 else 0.0
        if median <= 0:
            for watched in self._ranks.values():
                watched.below_since = watched.above_since = None  # nothing to judge by
            return []
        changes = []
        for rank, rate in sorted(rates.items()):
            watched = self._ranks.setdefault(rank, _Watched())
            if self._turned(watched, now, rate < self.rule.fraction * median):
                changes.append(Change(rank, watched.named, rate, median))
        return changes

    def _turned(self, watched: _Watched, now: float, slow: bool) -> bool:
        """Whether ``watched`` is named or cleared now."""
        if slow:
            watched.above_since = None
            watched.below_since = now if watched.below_since is None else watched.below_since
            if not watched.named and now - watched.below_since >= self.rule.seconds:
                watched.named = True
                return True
            return False
        watched.below_since = None
        if not watched.named:
            return False
        watched.above_since = now if watched.above_since is None else watched.above_since
        if now - watched.above_since >= RECOVERY_SHARE * self.rule.seconds:
            watched.named, watched.above_since = False, None
            return True
        return False


def likely_reason(
    status: RankStatus | None, swap_rate: float | None = None, outside: float | None = None
) -> str:
    """Why a rank is slow, from its latest resources (and its host's swapping, bytes/s, and the
    share of its time spent outside collectives, where measured)."""
    own = "" if outside is None else f"{outside:.0%} of its time is outside collectives; "
    if status is None:
        return f"unknown: {own}no resource figures from it yet"
    if swap_rate is not None and swap_rate >= SWAPPING:
        return (
            f"memory swapping: {own}its host swaps {swap_rate / 2**20:.1f} MB/s, the rank holds "
            f"{status.rss / 2**30:.2f} GB"
        )
    cores = status.cpu / status.cores if status.cores > 0 else 0.0
    if status.host_cpu >= CPU_SATURATED or cores >= CPU_SATURATED:
        host = f"its host's CPUs {status.host_cpu:.0f} % busy, " if status.host_cpu >= 0 else ""
        return f"CPU saturated: {own}{host}the rank at {status.cpu:.0f} % of one core ({status.cores} cores)"
    if status.gpu >= GPU_BUSY:
        return f"GPU busy: {own}{status.gpu:.0f} % utilised ({status.gpu_temperature:.0f} °C)"
    gpu = f", its GPU idle ({status.gpu:.0f} %)" if status.gpu >= 0 else ""
    return (
        f"data wait: {own}between steps it neither computes (CPU {status.cpu:.0f} % of one core{gpu}) "
        "nor swaps: it waits for its input (data loading, I/O) or sleeps"
    )


class StragglerWatch:
    """Fed each message of a run (``take``); ``check`` gives a ``Straggler`` when a rank is
    named and when it recovers. With no rule (``stragglers=off``) it does nothing."""

    def __init__(self, rule: StragglerRule | None) -> None:
        self.detector = StragglerDetector(rule) if rule is not None else None
        self.hosts: dict[int, str] = {}
        self.steps: dict[int, StepRate] = {}  # on the rank's own clock: its time outside collectives
        self.walls: dict[int, StepRate] = {}  # on the wall clock
        self.waited: dict[int, float] = {}  # each rank's waits in collectives, as last sent
        self.measuring: set[int] = set()  # ranks whose last step came with their waits
        self.own_clocks = False  # at the last check: every rank judged sent its waits
        self.statuses: dict[int, list[tuple[float, RankStatus]]] = {}  # the last two, per rank
        self.ended: set[int] = set()
        self._checked = -math.inf  # when ``check`` last judged

    def take(self, message: Message, now: float) -> None:
        record, rank = message.record, message.rank
        if self.detector is None:
            return
        if isinstance(record, Started):
            self.hosts[rank] = record.host
        elif isinstance(record, Reports):
            for step, sent, waited in _steps(message, now):
                if waited is None:
                    self.measuring.discard(rank)
                else:
                    self.measuring.add(rank)
                    self.waited[rank] = waited
                self.steps.setdefault(rank, StepRate()).add(step, sent - self.waited.get(rank, 0.0), now)
                self.walls.setdefault(rank, StepRate()).add(step, sent, now)
        elif isinstance(record, RankStatus):
            self.statuses[rank] = [*self.statuses.get(rank, [])[-1:], (now, record)]
        elif isinstance(record, (Exit, RankError)):
            self.ended.add(rank)

    def check(self, now: float) -> list[Straggler]:
        """Reports come in batches (ten a second, later under load), so a fast rank is always a
        step "late" between two batches: rates are judged ``REPORT_SLACK`` back, where only a
        real silence has made a rank's rate decay. Rates are on the ranks' own clocks (their
        time outside collectives, where every rank measures them), decayed as their wall-clock
        rates are."""
        if self.detector is None or now - self._checked < CHECK_SECONDS:
            return []
        self._checked = now
        rates, walls = {}, {}
        for rank, wall in self.walls.items():
            shown, own = wall.at(now - REPORT_SLACK), self.steps[rank].rate
            if rank not in self.ended and shown is not None and own is not None and wall.rate:
                rates[rank] = own * shown / wall.rate  # a silent rank decays as on the wall clock
                walls[rank] = shown
        self.own_clocks = all(rank in self.measuring for rank in rates)
        judged = rates if self.own_clocks else walls
        return [self._straggler(change) for change in self.detector.check(now, judged)]

    def _straggler(self, change: Change) -> Straggler:
        assert self.detector is not None
        rule, rank = self.detector.rule, change.rank
        statuses = self.statuses.get(rank, [])
        outside = self._outside(rank)
        reason = ""
        if change.named:
            status = statuses[-1][1] if statuses else None
            reason = likely_reason(status, _swap(statuses), outside)
        return Straggler(
            rank,
            self.hosts.get(rank, ""),
            change.rate,
            change.median,
            rule.fraction,
            rule.seconds,
            reason,
            recovered=not change.named,
            outside=-1.0 if outside is None else outside,
        )

    def _outside(self, rank: int) -> float | None:
        """The share of its time a rank spent outside collectives lately (None: judged by wall
        time, some rank sends no waits, or too few steps yet)."""
        own, wall = self.steps.get(rank), self.walls.get(rank)
        if not self.own_clocks or own is None or wall is None or not own.rate or wall.rate is None:
            return None
        return min(wall.rate / own.rate, 1.0)


def _steps(message: Message, now: float) -> list[tuple[int, float, float | None]]:
    """(step, when the rank sent it, the seconds it had waited in collectives by then) of each
    report of a ``Reports`` message that has a step."""
    try:
        reports = message.reports
        return [(int(r["step"]), float(r.get("t", now)), _float(r.get("w"))) for r in reports if "step" in r]
    except (ValueError, TypeError, KeyError, AttributeError):
        return []  # not what report() sends: nothing to judge by


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _swap(statuses: list[tuple[float, RankStatus]]) -> float | None:
    """Bytes a second its host swapped between the last two figures."""
    if len(statuses) < 2 or statuses[1][0] <= statuses[0][0]:
        return None
    (before, first), (after, second) = statuses
    return max(0, second.swapped - first.swapped) / (after - before)
