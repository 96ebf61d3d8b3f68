"""The live view's model: rank events in, plain state out. No widgets, no I/O.

``RunModel.apply(message)`` folds one rank message into per-rank progress, metric series and
terminal-like logs; ``version`` counts changes so a view can redraw only when something moved.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvd_magic.protocol import (
    Exit,
    Log,
    LogDecoder,
    Message,
    RankError,
    RankStatus,
    Reports,
    Stall,
    Started,
    Straggler,
    TimingOff,
)
from hvd_magic.widgets.step_rate import StepRate
from hvd_magic.widgets.terminal_log import TerminalLog

__all__ = ["RankProgress", "RunModel", "TerminalLog"]  # TerminalLog: terminal_log's

# the steps some rank reported a metric at, and there its mean, lowest and highest over the ranks
Grouped = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
MAX_POINTS = 2000  # per rank and metric; older points are thinned, never the newest


@dataclass
class RankProgress:
    rank: int
    host: str = ""
    state: str = "starting"  # starting, running, stalled, done, failed, ended (with the run,
    # no exit said); skipped: not in the cell
    stalled_on: list[str] = field(default_factory=list)  # tensors (calls) the others wait on it for
    stalled_action: str = "submitted"  # torch.distributed ranks: "reached"
    step: int | None = None
    total: int | None = None
    epoch: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    resources: RankStatus | None = None  # its latest CPU, memory and GPU figures
    peak_rss: int = 0
    straggling: Straggler | None = None  # named a straggler (until it recovers)
    steps: StepRate = field(default_factory=StepRate)

    @property
    def rate(self) -> float | None:
        """Steps per second, smoothed."""
        return self.steps.rate

    @property
    def step_seen(self) -> float | None:
        """When (the notebook's monotonic clock) its step last grew."""
        return self.steps.seen

    @property
    def fraction(self) -> float | None:
        if self.state == "done" and self.total:
            return 1.0
        if self.step is None or not self.total:
            return None
        return min(1.0, self.step / self.total)

    def rate_at(self, now: float) -> float | None:
        """Steps/s as shown at ``now``: the smoothed rate, but never more than one report's
        steps in the time since the last one came, so a rank that reports nothing (it waits in
        a collective) decays rather than showing its last rate for ever (``StepRate.at``)."""
        return self.steps.at(now) if self.state == "running" else self.rate

    def eta_at(self, now: float) -> float | None:
        rate = self.rate_at(now)
        if rate and self.total and self.step is not None and self.state == "running":
            return max(0.0, (self.total - self.step) / rate)
        return None

    def update(self, record: dict[str, Any]) -> None:
        if self.state in ("starting", "stalled"):
            self.state, self.stalled_on = "running", []
        if "total" in record:
            self.total = int(record["total"])
        if "epoch" in record:
            self.epoch = int(record["epoch"])
        if "step" in record:
            step = int(record["step"])
            self.steps.add(step, float(record.get("t", time.time())), time.monotonic())
            self.step = step
        self.metrics.update(record.get("metrics", {}))


@dataclass
class Series:
    steps: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, step: float, value: float) -> None:
        self.steps.append(step)
        self.values.append(value)
        if len(self.steps) > MAX_POINTS:  # keep every other old point, the newest always
            self.steps[:-1] = self.steps[:-1:2]
            self.values[:-1] = self.values[:-1:2]


class RunModel:
    """Everything the live view shows, built from the ranks' messages."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.progress = [RankProgress(rank) for rank in range(ranks)]
        self.series: dict[str, dict[int, Series]] = {}
        self.logs = [TerminalLog() for _ in range(ranks)]
        self.all_log = TerminalLog()
        self.started = time.monotonic()
        self.version = 0
        self.events = 0
        self.reports = 0
        self._dropped = [0] * ranks
        self.notices: list[str] = []
        self._timing_off = False  # a rank said its wait timing cost too much: shown once
        self._count = [0] * ranks  # x for metrics reported without a step
        self._forwarded = [0] * ranks  # lines of each rank already in the "all" log
        self._decoder = LogDecoder()
        self._grouped: tuple[tuple[str, int] | None, Grouped] = (None, (np.empty(0),) * 4)  # _by_step's
        self.lock = threading.Lock()  # held while a message is folded: read from another thread under it

    def apply(self, message: Message) -> None:
        with self.lock:
            self._apply(message)

    def _apply(self, message: Message) -> None:
        self.events += 1
        rank, record = message.rank, message.record
        if isinstance(record, Stall):
            self._stall(record)
            return
        if not 0 <= rank < self.ranks:
            return
        progress = self.progress[rank]
        if isinstance(record, Started):  # the rank's process runs the cell (a retry's: again)
            progress.host, progress.state, progress.stalled_on = record.host, "running", []
            progress.straggling = None
        elif isinstance(record, Reports):
            self._dropped[rank] = record.dropped  # cumulative per rank
            for report in message.reports:
                self._report(rank, report)
        elif isinstance(record, Log):
            self.logs[rank].feed(self._decoder.text(message))
            self._feed_all(rank)
        elif isinstance(record, RankError):
            progress.state = "failed"
        elif isinstance(record, Exit):
            progress.state = "skipped" if record.skipped else "done" if record.code == 0 else "failed"
            progress.straggling = None
        elif isinstance(record, RankStatus):
            progress.resources, progress.peak_rss = record, max(progress.peak_rss, record.rss)
        elif isinstance(record, Straggler):
            progress.straggling = None if record.recovered else record
        elif isinstance(record, TimingOff) and not self._timing_off:
            self._timing_off = True
            self.notices.append(f"hvd_magic: {record.text(rank)}")
        else:
            return
        self.version += 1

    def _stall(self, stall: Stall) -> None:
        """The other ranks wait on these ranks for these tensors (Horovod's report comes from rank
        0; torch.distributed's from the notebook's watch)."""
        for rank, tensors in zip(stall.ranks, stall.tensors, strict=True):
            if 0 <= rank < self.ranks and self.progress[rank].state in ("starting", "running", "stalled"):
                progress = self.progress[rank]
                progress.state, progress.stalled_on, progress.stalled_action = (
                    "stalled",
                    list(tensors),
                    stall.action,
                )
        self.version += 1

    def _report(self, rank: int, record: dict[str, Any]) -> None:
        self.reports += 1
        progress = self.progress[rank]
        self._count[rank] += 1
        # A metric reported without a step belongs to the rank's current step, if it has one.
        x = float(record.get("step", progress.step if progress.step is not None else self._count[rank]))
        progress.update(record)
        for name, value in record.get("metrics", {}).items():
            self.series.setdefault(name, {}).setdefault(rank, Series()).add(x, float(value))

    def _feed_all(self, rank: int) -> None:
        # The "all" log tags each complete line with its rank; partial lines wait in the rank log.
        log = self.logs[rank]
        new = log.committed - self._forwarded[rank]
        if new > 0:
            for line in log.lines[-new:]:
                self.all_log.feed(f"[{rank}] {line}\n")
            self._forwarded[rank] = log.committed

    def _by_step(self, metric: str) -> Grouped:
        """The steps some rank reported ``metric`` at, and there the mean, lowest and highest
        value over the ranks: one numpy pass over every rank's points (64 ranks hold 128,000),
        kept until the model changes, since a redraw asks for the mean and then the band."""
        if self._grouped[0] == (metric, self.version):
            return self._grouped[1]
        series = list(self.series.get(metric, {}).values())
        steps = np.concatenate([np.asarray(one.steps, dtype=float) for one in series] or [np.empty(0)])
        values = np.concatenate([np.asarray(one.values, dtype=float) for one in series] or [np.empty(0)])
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
        starts = np.flatnonzero(np.diff(steps, prepend=np.nan) != 0)  # each step's first point
        grouped: Grouped = (np.empty(0),) * 4
        if len(steps):
            counts = np.diff(np.append(starts, len(steps)))
            low, high = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
            grouped = (steps[starts], np.add.reduceat(values, starts) / counts, low, high)
        self._grouped = ((metric, self.version), grouped)
        return grouped

    @property
    def dropped_reports(self) -> int:
        return sum(self._dropped)

    def mean_series(self, metric: str) -> Series:
        """The mean over ranks at each step some rank reported."""
        steps, mean, _, _ = self._by_step(metric)
        return Series(steps.tolist(), mean.tolist())

    def band_series(self, metric: str) -> tuple[Series, Series]:
        """The lowest and highest value over ranks at each step."""
        steps, _, low, high = self._by_step(metric)
        return Series(steps.tolist(), low.tolist()), Series(steps.tolist(), high.tolist())

    def end(self) -> None:
        """The run is over: a rank that never said its exit (stopped with the run) is not running."""
        with self.lock:
            for progress in self.progress:
                if progress.state in ("starting", "running", "stalled"):
                    progress.state = "ended"
                    self.version += 1

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(("starting", "running", "stalled", "done", "failed", "ended", "skipped"), 0)
        for progress in self.progress:
            counts[progress.state] += 1
        return counts

    def summary(self) -> str:
        counts = self.counts()
        wall = time.monotonic() - self.started
        parts = [f"{self.ranks} ranks", f"{wall:.1f} s"]
        parts += [f"{n} {state}" for state, n in counts.items() if n and state != "done"]
        finals = []
        for name, by_rank in self.series.items():
            last = [s.values[-1] for s in by_rank.values() if s.values]
            if last:
                finals.append(f"{name} {sum(last) / len(last):.4g}")
        if finals:
            parts.append("mean of latest: " + ", ".join(finals))
        parts += [p.straggling.text() for p in self.progress if p.straggling is not None]
        if self.dropped_reports:
            parts.append(f"{self.dropped_reports} reports dropped (buffer full)")
        return " · ".join(parts + self.notices)
