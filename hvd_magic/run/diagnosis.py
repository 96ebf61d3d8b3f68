"""What went wrong in a run, from what was recorded: pure functions, no processes, no clocks.

The functions here turn a ``RunRecord`` (what the ranks said) and the launcher's view of dead
ranks (``RankDeath``) into one error that names the rank to blame and says what to do.
"""

from __future__ import annotations

import re

from hvd_magic.errors import FailureClass, RankFailedError, RunError, RunTimeout
from hvd_magic.launch.processes import RankDeath
from hvd_magic.protocol import CELL_FILENAME
from hvd_magic.run.record import RunRecord, is_consequence, timed_out

__all__ = [
    "death_host",
    "explained",
    "failure_after_exit",
    "failure_line",
    "left_behind",
    "left_waiting",
    "rank_failed",
    "silence_timeout",
    "silent_death",
    "stall_sentence",
    "stall_text",
    "start_timeout",
    "unloadable_value",
]

UNEVEN_HINT = (
    "This usually means the ranks had unequal work: shards of different sizes, or a different "
    "number of steps or batches per rank. Give every rank the same number of batches (equal "
    "shards, dropping the remainder), or let a rank that runs out of data join the others "
    "(Horovod: hvd.join(); DDP: the torch.distributed.algorithms.Join context manager)."
)


def silent_death(record: RunRecord, deaths: list[RankDeath]) -> RankDeath | None:
    """The first rank the launcher saw end that had not reported an error or its exit."""
    spoke = {failure.rank for failure in record.errors} | set(record.exited)
    return next((death for death in deaths if death.rank not in spoke), None)


def explained(record: RunRecord, deaths: list[RankDeath]) -> bool:
    """Whether the errors so far have their cause in the record: a rank's own error, a rank
    that died without a word, or a rank that finished while others still communicated."""
    return (
        record.cause is not None
        or silent_death(record, deaths) is not None
        or bool(record.finished())
        or left_behind(record) is not None
    )


def rank_failed(record: RunRecord, death: RankDeath | None) -> RankFailedError:
    """The error for a run in which a rank failed: its cause if a rank reported one, else the
    rank that died without a word (when the launcher saw one), else ranks that finished early
    (uneven work), else the first error."""
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
    return RankFailedError(
        rank=failure.rank,
        host=error.host,
        exc_type=error.exc_type,
        message=error.message,
        remote_traceback=error.traceback,
        stopped=record.ranks - 1,
        failure=FailureClass.CODE if record.cause is not None else FailureClass.COMMUNICATION,
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
    if record.result is None and not problems:
        problems.append("rank 0 finished without sending its result")
    error = RunError(
        f"the run failed (launcher exit code {code}): "
        + "; ".join(problems or ["see the output above"])
        + (f"\n\nlauncher output:\n{tail}" if tail else "")
    )
    error.failure = failure
    return error


def failure_line(error: RunError) -> str:
    """'rank 1 on vm failed (out of memory)': the view's line for a run a rank's failure ended."""
    failure = error.failure.value if error.failure is not None else "failed"
    if isinstance(error, RankFailedError):
        return f"rank {error.rank}{f' on {error.host}' if error.host else ''} failed ({failure})"
    return f"the run failed ({failure})"


def last_memory(record: RunRecord, death: RankDeath) -> str:
    """'; its last reported memory: 1,480 MiB' for a rank the OOM killer took, else ''."""
    series = record.resources.get(death.rank)
    if death.failure is not FailureClass.OOM or not series:
        return ""
    return f"; its last reported memory: {series[-1][1].rss / 2**20:,.0f} MiB"


def death_host(record: RunRecord, death: RankDeath) -> str:
    """Where a dead rank ran: the launcher's word for it, else the host the rank reported."""
    return death.host or record.started.get(death.rank, "")


def _named(record: RunRecord, death: RankDeath) -> str:
    """'rank 2', and its host when the host is what was lost ('rank 2 on hostC')."""
    host = death_host(record, death)
    return f"rank {death.rank} on {host}" if death.host_lost and host else f"rank {death.rank}"


def start_timeout(record: RunRecord, limit: float) -> RunTimeout:
    return RunTimeout(
        f"ranks {record.never_started()} did not start within {limit:.0f} s ({len(record.started)} of "
        f"{record.ranks} did); the run was stopped. Check the launcher output above, or set "
        "HVD_MAGIC_START_TIMEOUT for slow clusters."
    )


def silence_timeout(record: RunRecord, timeout: float, now: float, where: str = "") -> RunTimeout:
    silent = ", ".join(
        f"rank {rank} for {now - seen:.0f} s" for rank, seen in sorted(record.last_seen.items()) if rank >= 0
    )
    never = record.never_started()
    return RunTimeout(
        f"no rank reported anything for {timeout:.0f} s (timeout={timeout:g}); "
        f"the run was stopped. Silent: {silent or 'every rank'}."
        + (f" Never started: ranks {never}." if never else "")
        + stall_sentence(record, now)
        + where
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


def stall_text(record: RunRecord, now: float) -> str:
    """'stalled: rank 0 never submitted allreduce.t3 (rank 1 waiting 63 s)', or ''."""
    if record.stall is None:
        return ""
    stall = record.stall.stall
    waiting = [rank for rank in range(record.ranks) if rank not in stall.ranks]
    who = f"rank {waiting[0]}" if len(waiting) == 1 else f"ranks {', '.join(map(str, waiting))}"
    seconds = now - record.stall.since + stall.threshold
    return f"stalled: {stall.missing()} ({who} waiting over {seconds:.0f} s)"


def stall_sentence(record: RunRecord, now: float) -> str:
    """' Horovod says it stalled: ...' (or ' It stalled: ...' from torch ranks' waits), or ''."""
    text = stall_text(record, now)
    if record.stall is None or not text:
        return ""
    source = record.stall.stall.source
    return f" {source} says it {text}." if source else f" It {text}."


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
    alongside = {rank for rank, other in record.waits.items() if other.call == wait.call}
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


def left_waiting(record: RunRecord, now: float) -> RankFailedError:
    """Ranks finished while the others wait for them in a torch.distributed call (which would
    wait until torch's timeout, 30 minutes by default)."""
    assert record.stall is not None, "left_waiting needs the stall"
    stall = record.stall.stall
    gone = stall.ranks[0]
    waiting = sorted(record.waits)
    return RankFailedError(
        rank=gone,
        host=record.started.get(gone, ""),
        exc_type="",
        message=(
            f"it finished without reaching {stall.tensors[0][0]}, where "
            f"{_ranks(waiting)} waited over {now - min(w.since for w in record.waits.values()):.0f} s "
            f"for it. Every rank must make the same torch.distributed calls, in the same order. "
            f"{UNEVEN_HINT}"
        ),
        remote_traceback="",
        stopped=record.ranks - 1,
    )


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def unloadable_value(err: Exception) -> RunError:
    """Rank 0's value arrived but cannot be unpickled in the notebook."""
    return RunError(
        f"the run finished, but rank 0's value (the cell's last expression, or return= names) "
        f"could not be loaded in the notebook: {type(err).__name__}: {str(err)[:300]}. End the "
        "cell with ';' or return plain data (numbers, lists, arrays, state_dicts)."
    )
