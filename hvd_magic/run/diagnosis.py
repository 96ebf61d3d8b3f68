"""What went wrong in a run, from what was recorded: pure functions, no processes, no clocks.

The functions here turn a ``RunRecord`` (what the ranks said) and the launcher's view of dead
ranks (``RankDeath``) into one error that names the rank to blame and says what to do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hvd_magic.errors import FailureClass, RankFailedError, RunError
from hvd_magic.launch.processes import RankDeath
from hvd_magic.protocol import CELL_FILENAME
from hvd_magic.run.record import RunRecord, is_consequence, timed_out
from hvd_magic.run.timeouts import UNEVEN_HINT

__all__ = [
    "clean_end",
    "death_host",
    "explained",
    "failure_after_exit",
    "failure_line",
    "left_behind",
    "rank_failed",
    "run_stopped",
    "silent_death",
    "unaccounted",
    "unloadable_value",
]


def silent_death(record: RunRecord, deaths: list[RankDeath]) -> RankDeath | None:
    """The first rank the launcher saw end that had not reported an error or its exit."""
    spoke = {failure.rank for failure in record.errors} | set(record.exited)
    return next((death for death in deaths if death.rank not in spoke), None)


def unaccounted(record: RunRecord, deaths: list[RankDeath], ended_by: str | None) -> tuple[bool, bool]:
    """After the launcher ended: is a started rank still to be heard from (neither its exit nor
    its death known), and is one dead without having said its exit? A run stopped from outside
    (``ended_by``) took all its ranks with it."""
    dead = set(record.started) if ended_by is not None else {death.rank for death in deaths}
    quiet = record.unfinished()
    return any(rank not in dead for rank in quiet), any(rank in dead for rank in quiet)


def clean_end(record: RunRecord, code: int) -> bool:
    """Every rank started and said its exit, none an error, rank 0's result is in, the launcher
    exited 0: nothing to explain (nor to ask the launcher: a Spark launcher's deaths ask Spark)."""
    ended = code == 0 and not record.errors and not record.unfinished()
    return ended and not record.never_started() and record.result is not None


def explained(record: RunRecord, deaths: list[RankDeath], ended_by: str | None = None) -> bool:
    """Whether the errors so far have their cause in the record: a rank's own error, a rank
    that died without a word, a rank that finished while others still communicated, or what
    stopped the whole run from outside (``ended_by``, the launcher's word)."""
    return (
        record.cause is not None
        or ended_by is not None
        or silent_death(record, deaths) is not None
        or bool(record.finished())
        or left_behind(record) is not None
    )


def rank_failed(
    record: RunRecord, death: RankDeath | None, ended_by: str | None = None, said: Sequence[str] = ()
) -> RunError:
    """The error for a run in which a rank failed: its cause if a rank reported one, else what
    stopped the whole run from outside (``ended_by``: a run Spark cancelled is no rank's
    failure), else the rank that died without a word (when the launcher saw one), else ranks
    that finished early (uneven work), else the first error. A rank interrupted from outside
    carries what the launcher said of its own stops (``Launcher.said``)."""
    if record.cause is None and ended_by is not None:
        return run_stopped(ended_by)
    error: RunError = _rank_failed(record, death)
    error.cause = _cause(record, death)
    if isinstance(error, RankFailedError) and error.message == INTERRUPTED_FROM_OUTSIDE and said:
        error.add_note("its launcher said:\n" + "\n".join(said[-5:]))
    return error


def run_stopped(ended_by: str, started: bool = True) -> RunError:
    """'the run was stopped: Spark cancelled the run's tasks (Job 3 cancelled ...); its ranks
    ended with it': the run's failure, not rank 0's (``ended_by``: the launcher's word;
    ``started``: whether any rank had started)."""
    what = f"the run was stopped{'' if started else ' before its ranks started'}: {ended_by}"
    error = RunError(f"{what}{'; its ranks ended with it' if started else ''}")
    error.failure, error.cause = FailureClass.CANCELLED, what
    return error


def _cause(record: RunRecord, death: RankDeath | None) -> str:
    """What ended the run, in a few words (``RunError.cause``: each attempt's line says it)."""
    if record.cause is not None:
        return f"rank {record.cause.rank} raised {record.cause.error.exc_type}"
    if death is not None:
        return death.said(death_host(record, death))
    gone = sorted(set(record.started) - set(record.exited))
    if gone:  # no launcher saw them end: their Spark tasks went with them
        where = sorted({record.started[rank] for rank in gone if record.started[rank]})
        hosts = f" on {', '.join(where)}" if where else ""
        return f"rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))}{hosts} ended without a word"
    if record.never_started():
        return f"ranks {record.never_started()} never started"
    return f"rank {record.errors[0].rank}: {record.errors[0].error.exc_type}" if record.errors else ""


# A rank's KeyboardInterrupt before the notebook stopped the run: its SIGINT came from elsewhere
INTERRUPTED_FROM_OUTSIDE = "interrupted (SIGINT) from outside the run, before the notebook stopped it"


def _rank_failed(record: RunRecord, death: RankDeath | None) -> RankFailedError:
    failure = record.first_error
    assert failure is not None, "rank_failed needs a recorded error"
    if record.cause is None and death is None and (uneven := uneven_work(record)) is not None:
        return uneven
    if record.cause is None and death is None and (behind := left_behind(record)) is not None:
        return behind
    if record.cause is None and death is not None:
        return RankFailedError(
            rank=death.rank,
            host=death_host(record, death),
            exc_type="",
            message=(
                f"it {death.what}{last_memory(record, death)}; rank {failure.rank} then failed "
                f"because of it ({failure.error.exc_type})"
            ),
            remote_traceback="",
            stopped=record.ranks - 1,
            failure=death.failure,
        )
    error = failure.error
    interrupted = record.cause is None and error.exc_type == "KeyboardInterrupt"  # not by our stop
    kind = FailureClass.KILLED if interrupted else FailureClass.COMMUNICATION
    return RankFailedError(
        rank=failure.rank,
        host=error.host,
        exc_type=error.exc_type,
        message=INTERRUPTED_FROM_OUTSIDE if interrupted and not error.message else error.message,
        remote_traceback=error.traceback,
        stopped=record.ranks - 1,
        failure=FailureClass.CODE if record.cause is not None else kind,
    )


def failure_after_exit(
    record: RunRecord, code: int, deaths: list[RankDeath], tail: str, ended_by: str | None = None
) -> RunError | None:
    """Why a run whose launcher ended did not succeed, or None if it did (rank 0's result is in).

    ``tail`` is the launcher's own output, shown when nothing better explains the failure.
    """
    if record.errors:
        return rank_failed(record, silent_death(record, deaths), ended_by)
    if clean_end(record, code):
        return None
    never_started, unfinished = record.never_started(), record.unfinished()
    if ended_by is not None:
        return run_stopped(ended_by, started=bool(record.started))
    problems, failure = [], FailureClass.LOST if never_started else None
    if never_started:
        problems.append(f"ranks {never_started} never started")
    death = silent_death(record, deaths)
    if death is not None:
        failure = death.failure
        said = f"{_named(record, death)} {death.what}{last_memory(record, death)}"
        problems.append(f"{death.failure.value}: {said}")
        gone = {death.rank} | ({d.rank for d in deaths if d.host_lost} if death.host_lost else set())
        unfinished = [rank for rank in unfinished if rank not in gone]  # its host's ranks: named
    if unfinished:
        how = "died without reporting (killed, or crashed in native code)"
        if death is not None:  # the launcher stops the others, or they lost their peer
            how = "were stopped because of it"
        problems.append(f"ranks {sorted(unfinished)} {how}")
        failure = failure or FailureClass.LOST  # no launcher saw them end: their Spark tasks went too
    if record.result is None and not problems:
        problems.append("rank 0 finished without sending its result")
    error = RunError(
        f"the run failed (launcher exit code {code}): "
        + "; ".join(problems or ["see the output above"])
        + (f"\n\nlauncher output:\n{tail}" if tail else "")
    )
    error.failure, error.cause = failure, _cause(record, death)
    return error


def failure_line(error: RunError) -> str:
    """'rank 1 on vm failed (out of memory)': the view's line for a run a rank's failure ended."""
    failure = error.failure.value if error.failure is not None else "failed"
    if isinstance(error, RankFailedError):
        return f"rank {error.rank}{f' on {error.host}' if error.host else ''} failed ({failure})"
    return f"the run failed ({failure})"


def last_memory(record: RunRecord, death: RankDeath) -> str:
    """'; its last reported memory: 1,480 MiB' for a rank the OOM killer took, else ''."""
    latest = record.resources.get(death.rank)
    if death.failure is not FailureClass.OOM or latest is None:
        return ""
    return f"; its last reported memory: {latest.rss / 2**20:,.0f} MiB"


def death_host(record: RunRecord, death: RankDeath) -> str:
    """Where a dead rank ran: the launcher's word for it, else the host the rank reported."""
    return death.host or record.started.get(death.rank, "")


def _named(record: RunRecord, death: RankDeath) -> str:
    """'rank 2', and its host when the host is what was lost ('rank 2 on hostC')."""
    host = death_host(record, death)
    return f"rank {death.rank} on {host}" if death.host_lost and host else f"rank {death.rank}"


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
            f"({collective_in(stuck.error.traceback)}), which then failed. {UNEVEN_HINT}"
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
            code = re.sub(r"\s{2,}#.*$", "", lines[index + 1].strip())  # an inline comment
            return f"{code} at line {number} of {where}"
    return "a collective"


def left_behind(record: RunRecord) -> RankFailedError | None:
    """torch.distributed ranks timed out waiting (their waits are known): blame the ranks that
    were not waiting in the same call, as Horovod's stall inspector would (a rank waiting in
    another call is as far from it as one doing something else)."""
    found = next(
        ((f, w) for f in record.errors if timed_out(f.error) and (w := record.last_wait(f.rank))), None
    )
    if found is None:
        return None
    late, wait = found
    failed = {f.rank for f in record.errors}
    # the others waiting in the call, or until just now (their own failure in it still on its way)
    alongside = {r for r in range(record.ranks) if (other := record.last_wait(r)) and other.call == wait.call}
    gone = failed | alongside | set(record.exited)
    behind = [rank for rank in range(record.ranks) if rank not in gone]
    if not behind:
        return None
    first_line = late.error.message.strip().splitlines()[0][:200]
    return RankFailedError(
        rank=behind[0],
        host=record.started.get(behind[0], ""),
        exc_type="",
        message=(
            f"it was behind; rank {late.rank} timed out waiting for it in {wait.call} "
            f"({wait.where or 'torch.distributed'}): {late.error.exc_type}: {first_line}. See what "
            f"rank {behind[0]} was doing (its log above); every rank must make the same "
            "torch.distributed calls, in the same order."
        ),
        remote_traceback=late.error.traceback,
        stopped=record.ranks - 1,
    )


def unloadable_value(err: Exception) -> RunError:
    """Rank 0's value arrived but cannot be unpickled in the notebook."""
    return RunError(
        f"the run finished, but rank 0's value (the cell's last expression, or return= names) "
        f"could not be loaded in the notebook: {type(err).__name__}: {str(err)[:300]}. End the "
        "cell with ';' or return plain data (numbers, lists, arrays, state_dicts)."
    )
