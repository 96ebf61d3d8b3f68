"""What went wrong in a run, from what was recorded: pure functions, no processes, no clocks.

``RunRecord`` folds the ranks' messages into what the diagnosis needs (who started where, who
exited, errors in arrival order, rank 0's result, when each rank last spoke, a stall Horovod
reported). The functions below turn a record and the launcher's view of dead ranks
(``RankDeath``) into one error that names the rank to blame and says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import RankFailedError, RunError, RunTimeout
from .launch.processes import RankDeath
from .protocol import CELL_FILENAME, Exit, Message, RankError, Reports, Result, Stall, Started

__all__ = [
    "RunRecord",
    "explained",
    "failure_after_exit",
    "is_consequence",
    "rank_failed",
    "silence_timeout",
    "silent_death",
    "stall_text",
    "start_timeout",
]

UNEVEN_HINT = (
    "This usually means the ranks had unequal work: shards of different sizes, or a different "
    "number of steps or batches per rank. Give every rank the same number of batches (equal "
    "shards, dropping the remainder), or call hvd.join() when a rank runs out of data."
)


@dataclass(frozen=True)
class Failure:
    """A rank's error as it arrived."""

    rank: int
    error: RankError


@dataclass(frozen=True)
class StallSeen:
    """The latest stall Horovod reported, and when it was first reported (the run's clock)."""

    stall: Stall
    since: float


@dataclass
class RunRecord:
    ranks: int
    began: float = 0.0
    started: dict[int, str] = field(default_factory=dict)  # rank -> host
    exited: dict[int, int] = field(default_factory=dict)  # rank -> exit code
    errors: list[Failure] = field(default_factory=list)  # in arrival order
    result: bytes | None = None
    last_message: float = 0.0
    last_seen: dict[int, float] = field(default_factory=dict)
    stall: StallSeen | None = None

    def apply(self, message: Message, at: float) -> None:
        """Fold in ``message``, which arrived at ``at`` (the run's clock). A stall report is
        not progress: it does not count against ``timeout=``."""
        record = message.record
        if isinstance(record, Stall):
            same = self.stall is not None and self.stall.stall == record
            self.stall = StallSeen(record, self.stall.since if self.stall and same else at)
            return
        self.last_message = at
        self.last_seen[message.rank] = at
        if self.stall is not None and message.rank in self.stall.stall.ranks:
            if isinstance(record, (Reports, Exit, RankError)):  # the missing rank moved on
                self.stall = None
        if isinstance(record, Started):
            self.started[message.rank] = record.host
        elif isinstance(record, RankError):
            self.errors.append(Failure(message.rank, record))
        elif isinstance(record, Result):
            self.result = message.blob
        elif isinstance(record, Exit):
            self.exited[message.rank] = record.code

    def finished(self) -> list[int]:
        """Ranks that ended normally (exit code 0)."""
        return sorted(rank for rank, code in self.exited.items() if code == 0)

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
    KeyboardInterrupt in a rank is our own stop (ranks have sessions of their own)."""
    return error.exc_type in ("HorovodInternalError", "KeyboardInterrupt") or (
        "Horovod has been shut down" in error.message
    )


def silent_death(record: RunRecord, deaths: list[RankDeath]) -> RankDeath | None:
    """The first rank the launcher saw end that had not reported an error or its exit."""
    spoke = {failure.rank for failure in record.errors} | set(record.exited)
    return next((death for death in deaths if death.rank not in spoke), None)


def explained(record: RunRecord, deaths: list[RankDeath]) -> bool:
    """Whether the errors so far have their cause in the record: a rank's own error, a rank
    that died without a word, or a rank that finished while others still communicated."""
    return record.cause is not None or silent_death(record, deaths) is not None or bool(record.finished())


def rank_failed(record: RunRecord, death: RankDeath | None) -> RankFailedError:
    """The error for a run in which a rank failed: its cause if a rank reported one, else the
    rank that died without a word (when the launcher saw one), else ranks that finished early
    (uneven work), else the first error."""
    failure = record.first_error
    assert failure is not None, "rank_failed needs a recorded error"
    if record.cause is None and death is None and (uneven := uneven_work(record)) is not None:
        return uneven
    if record.cause is None and death is not None:
        return RankFailedError(
            rank=death.rank,
            host=death.host or record.started.get(death.rank, ""),
            exc_type="",
            message=f"it {death.what}; then rank {failure.rank} failed with {failure.error.exc_type}",
            remote_traceback="",
            stopped=record.ranks - 1,
        )
    error = failure.error
    return RankFailedError(
        rank=failure.rank,
        host=error.host,
        exc_type=error.exc_type,
        message=error.message,
        remote_traceback=error.traceback,
        stopped=record.ranks - 1,
    )


def failure_after_exit(record: RunRecord, code: int, deaths: list[RankDeath], tail: str) -> RunError | None:
    """Why a run whose launcher ended did not succeed, or None if it did (rank 0's result is in).

    ``tail`` is the launcher's own output, shown when nothing better explains the failure.
    """
    if record.errors:
        return rank_failed(record, silent_death(record, deaths))
    never_started = record.never_started()
    unfinished = [rank for rank in record.started if rank not in record.exited]
    if code == 0 and not never_started and not unfinished and record.result is not None:
        return None
    problems = []
    if never_started:
        problems.append(f"ranks {never_started} never started")
    death = silent_death(record, deaths)
    if death is not None:
        problems.append(f"rank {death.rank} {death.what}")
        unfinished = [rank for rank in unfinished if rank != death.rank]
    if unfinished:
        problems.append(
            f"ranks {sorted(unfinished)} died without reporting (killed, or crashed in native code)"
        )
    if record.result is None and not problems:
        problems.append("rank 0 finished without sending its result")
    return RunError(
        f"the run failed (launcher exit code {code}): "
        + "; ".join(problems or ["see the output above"])
        + (f"\n\nlauncher output:\n{tail}" if tail else "")
    )


def start_timeout(record: RunRecord, limit: float) -> RunTimeout:
    return RunTimeout(
        f"ranks {record.never_started()} did not start within {limit:.0f} s ({len(record.started)} of "
        f"{record.ranks} did); the run was stopped. Check the launcher output above, or set "
        "HVD_MAGIC_START_TIMEOUT for slow clusters."
    )


def silence_timeout(record: RunRecord, timeout: float, now: float) -> RunTimeout:
    silent = ", ".join(
        f"rank {rank} for {now - seen:.0f} s" for rank, seen in sorted(record.last_seen.items()) if rank >= 0
    )
    never = record.never_started()
    stalled = stall_text(record, now)
    return RunTimeout(
        f"no rank reported anything for {timeout:.0f} s (timeout={timeout:g}); "
        f"the run was stopped. Silent: {silent or 'every rank'}."
        + (f" Never started: ranks {never}." if never else "")
        + (f" Horovod says it {stalled}." if stalled else "")
    )


def uneven_work(record: RunRecord) -> RankFailedError | None:
    """Some ranks finished while another was still in a collective: Horovod shut down under it."""
    finished = record.finished()
    stuck = next((f for f in record.errors if is_consequence(f.error) and f.rank not in finished), None)
    if not finished or stuck is None:
        return None
    who = f"rank {finished[0]}" if len(finished) == 1 else f"ranks {', '.join(map(str, finished))}"
    return RankFailedError(
        rank=stuck.rank,
        host=stuck.error.host,
        exc_type="",
        message=(
            f"uneven work: {who} finished while rank {stuck.rank} was still in a collective "
            f"({collective_in(stuck.error.traceback)}), which Horovod then shut down. {UNEVEN_HINT}"
        ),
        remote_traceback=stuck.error.traceback,
        stopped=record.ranks - 1,
    )


def collective_in(traceback: str) -> str:
    """The user's line a rank was on when it failed, from its traceback text."""
    lines = traceback.splitlines()
    for index in range(len(lines) - 2, -1, -1):
        line = lines[index].strip()
        if line.startswith('File "') and "site-packages" not in line and index + 1 < len(lines):
            where = "the cell" if CELL_FILENAME in line else line.split('"')[1]
            number = line.split(", line ")[-1].split(",")[0]
            return f"{lines[index + 1].strip()} at line {number} of {where}"
    return "a collective"


def stall_text(record: RunRecord, now: float) -> str:
    """'stalled: rank 0 never submitted allreduce.t3 (rank 1 waiting 63 s)', or ''."""
    if record.stall is None:
        return ""
    stall = record.stall.stall
    waiting = [rank for rank in range(record.ranks) if rank not in stall.ranks]
    who = f"rank {waiting[0]}" if len(waiting) == 1 else f"ranks {', '.join(map(str, waiting))}"
    seconds = now - record.stall.since + stall.threshold
    return f"stalled: {stall.missing()} ({who} waiting over {seconds:.0f} s)"
