"""What a run's ranks said, folded into what the diagnosis needs (pure): who started where,
who exited, errors in arrival order, rank 0's result, when each rank last spoke, a stall
Horovod reported, where torch.distributed ranks wait, the stragglers named; and which errors
are only consequences of another rank's."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hvd_magic.protocol import (
    Exit,
    Message,
    RankError,
    RankStatus,
    Reports,
    Result,
    Stall,
    Started,
    Straggler,
    Waiting,
)
from hvd_magic.run.stalls import WaitSeen

__all__ = ["Failure", "RunRecord", "StallSeen", "is_consequence", "timed_out"]

# What torch.distributed ranks raise when a peer is gone, or did not come in time.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote process exited")
_TIMED_OUT = ("Timed out waiting", "collective operation timeout", "waiting for clients")


@dataclass(frozen=True)
class Failure:
    """A rank's error as it arrived."""

    rank: int
    error: RankError


@dataclass(frozen=True)
class StallSeen:
    """The latest stall (Horovod's stall inspector, or ours from torch ranks' waits), and when it
    was first reported (the run's clock)."""

    stall: Stall
    since: float

    @property
    def own(self) -> bool:
        """Found by hvd_magic in the ranks' waits, not reported by Horovod."""
        return not self.stall.source


@dataclass
class RunRecord:
    ranks: int
    began: float = 0.0
    started: dict[int, str] = field(default_factory=dict)  # rank -> host
    pids: dict[int, int] = field(default_factory=dict)  # rank -> its process id, on its host
    exited: dict[int, int] = field(default_factory=dict)  # rank -> exit code
    skipped: set[int] = field(default_factory=set)  # a live session's ranks not in the cell
    errors: list[Failure] = field(default_factory=list)  # in arrival order
    result: bytes | None = None
    last_message: float = 0.0
    last_seen: dict[int, float] = field(default_factory=dict)
    stall: StallSeen | None = None
    waits: dict[int, WaitSeen] = field(default_factory=dict)  # torch.distributed ranks waiting
    # a wait that just ended, kept until the rank moves on: a call that fails ends its wait, and
    # the rank's watch, or its exit, may be folded in before the failure is judged
    ended_waits: dict[int, WaitSeen] = field(default_factory=dict)
    resources: dict[int, RankStatus] = field(default_factory=dict)  # each rank's latest (a beat a second)
    peaks: dict[int, RankStatus] = field(default_factory=dict)  # each rank's highest memory and CPU seen
    stragglers: list[Straggler] = field(default_factory=list)  # named and recovered, in time

    def apply(self, message: Message, at: float) -> None:
        """Fold in ``message``, which arrived at ``at`` (the run's clock). A stall report is
        not progress: it does not count against ``timeout=``."""
        record = message.record
        if isinstance(record, Stall):
            same = self.stall is not None and self.stall.stall == record
            self.stall = StallSeen(record, self.stall.since if self.stall and same else at)
            return
        if isinstance(record, RankStatus):  # a rank's resources, not progress; none kept in a list,
            self.resources[message.rank] = record  # which a run of days of 64 ranks grew to GiBs
            peak = self.peaks.get(message.rank, record)
            self.peaks[message.rank] = replace(
                peak, rss=max(peak.rss, record.rss), cpu=max(peak.cpu, record.cpu)
            )
            return
        if isinstance(record, Straggler):  # the notebook's own finding
            self.stragglers.append(record)
            return
        if isinstance(record, Waiting):  # not progress either
            self._wait(message.rank, record, at)
            return
        self.last_message = at
        self.last_seen[message.rank] = at
        if self.stall is not None and message.rank in self.stall.stall.ranks:
            if isinstance(record, (Reports, Exit, RankError)):  # the missing rank moved on
                self.stall = None
        if isinstance(record, Reports):
            self.ended_waits.pop(message.rank, None)  # it moved on
        if isinstance(record, Started):
            self.started[message.rank] = record.host
            self.pids[message.rank] = record.pid
        elif isinstance(record, RankError):
            self.errors.append(Failure(message.rank, record))
        elif isinstance(record, Result):
            self.result = message.blob
        elif isinstance(record, Exit):
            self.exited[message.rank] = record.code
            self._end_wait(message.rank)  # its wait ended with it
            if record.skipped:
                self.skipped.add(message.rank)

    def _wait(self, rank: int, record: Waiting, at: float) -> None:
        self.ended_waits.pop(rank, None)
        if record.call:
            self.waits[rank] = WaitSeen(record.call, record.where, at - record.seconds)
        else:
            self._end_wait(rank)

    def _end_wait(self, rank: int) -> None:
        """``rank``'s wait, if any, is over: kept as the one that just ended."""
        if (ended := self.waits.pop(rank, None)) is not None:
            self.ended_waits[rank] = ended

    def unfinished(self) -> list[int]:
        """The started ranks that have not said their exit."""
        return [rank for rank in self.started if rank not in self.exited]

    def all_exited(self) -> bool:
        """Ranks started, and every one of them said its exit."""
        return bool(self.started) and not self.unfinished()

    def last_wait(self, rank: int) -> WaitSeen | None:
        """Where ``rank`` waits, or waited until just now (nothing else came from it since)."""
        return self.waits.get(rank) or self.ended_waits.get(rank)

    def finished(self) -> list[int]:
        """Ranks that ended normally (exit code 0), not counting those that skipped the cell."""
        return sorted(rank for rank, code in self.exited.items() if code == 0 and rank not in self.skipped)

    def peak_rss(self) -> dict[int, int]:
        """Each rank's highest memory (its process tree's RSS, bytes) seen in the run."""
        return {rank: peak.rss for rank, peak in self.peaks.items()}

    def never_started(self) -> list[int]:
        return [rank for rank in range(self.ranks) if rank not in self.started]

    @property
    def cause(self) -> Failure | None:
        """The error to blame: the first that is not a consequence of another rank's failure."""
        return next((f for f in self.errors if not is_consequence(f.error)), None)

    @property
    def first_error(self) -> Failure | None:
        return self.cause or (self.errors[0] if self.errors else None)


def is_consequence(error: RankError) -> bool:
    """Horovod shuts down on every rank once one fails; the others then raise this. A
    KeyboardInterrupt in a rank is our own stop (ranks have sessions of their own).
    torch.distributed ranks fail when a peer is gone or late (its cause is elsewhere)."""
    return (
        error.exc_type in ("HorovodInternalError", "KeyboardInterrupt")
        or "Horovod has been shut down" in error.message
        or any(text in error.message for text in _PEER_GONE)
        or timed_out(error)
    )


def timed_out(error: RankError) -> bool:
    return error.exc_type == "DistStoreError" or any(text in error.message for text in _TIMED_OUT)
