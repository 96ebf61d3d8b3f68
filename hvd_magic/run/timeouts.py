"""What a run that stops making progress says (pure, but for ``start_limit``'s reading of the
environment): a stall that Horovod or the torch ranks'
waits reported, a run silent for ``timeout=``, ranks that never started, ranks left waiting in
a torch.distributed call by ranks that finished."""

from __future__ import annotations

import math
import os

from hvd_magic.errors import LaunchError, RankFailedError, RunTimeout
from hvd_magic.run.record import RunRecord

__all__ = [
    "UNEVEN_HINT",
    "left_waiting",
    "silence_timeout",
    "stall_sentence",
    "stall_text",
    "start_limit",
    "start_timeout",
]

UNEVEN_HINT = (
    "This usually means the ranks had unequal work: shards of different sizes, or a different "
    "number of steps or batches per rank. Give every rank the same number of batches (equal "
    "shards, dropping the remainder), or let a rank that runs out of data join the others "
    "(Horovod: hvd.join(); DDP: the torch.distributed.algorithms.Join context manager)."
)


def start_limit() -> float:
    """How long a run's ranks have to start: ``HVD_MAGIC_START_TIMEOUT`` as it is now (``%env``
    in the notebook counts from the next run), 300 s where it is not set."""
    text = os.environ.get("HVD_MAGIC_START_TIMEOUT", "300")
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise LaunchError(
            f"HVD_MAGIC_START_TIMEOUT={text!r}: say how many seconds the ranks have to start, e.g. 900"
        )
    return seconds


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


def stall_text(record: RunRecord, now: float) -> str:
    """'stalled: rank 0 never submitted allreduce.t3 (rank 1 waiting 63 s)', or ''."""
    if record.stall is None:
        return ""
    stall = record.stall.stall
    waiting = [rank for rank in range(record.ranks) if rank not in stall.ranks]
    who = f"rank {waiting[0]}" if len(waiting) == 1 else f"ranks {', '.join(map(str, waiting))}"
    seconds = now - record.stall.since + stall.threshold
    if not waiting:  # each rank waits for a tensor another never submitted
        return (
            f"stalled: {stall.missing()} (every rank waiting over {seconds:.0f} s for a tensor another "
            "never submitted: the ranks' calls do not match)"
        )
    return f"stalled: {stall.missing()} ({who} waiting over {seconds:.0f} s)"


def stall_sentence(record: RunRecord, now: float) -> str:
    """' Horovod says it stalled: ...' (or ' It stalled: ...' from torch ranks' waits), or ''."""
    text = stall_text(record, now)
    if record.stall is None or not text:
        return ""
    source = record.stall.stall.source
    return f" {source} says it {text}." if source else f" It {text}."


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
