"""The notebook's live session: ``%horovod start|status|stacks|debug|stop`` and ``%%horovod`` cells without
``np=`` (the magic module parses, this one keeps the one session of the kernel)."""

from __future__ import annotations

import atexit
import sys
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
from IPython.core.error import UsageError

from hvd_magic.errors import RankFailedError, RunError, SessionEnded
from hvd_magic.options import OptionError, RunOptions, cell_options
from hvd_magic.protocol import PostMortem
from hvd_magic.run import stacks
from hvd_magic.run.packing import Packed
from hvd_magic.session.live import LiveSession
from hvd_magic.session.ranks import hosts_and_pids

__all__ = [
    "VERBS",
    "cell_run",
    "debug",
    "run_on",
    "current",
    "session_cell_options",
    "stacks_text",
    "start",
    "status_text",
    "stop",
    "timeline_ready",
]

VERBS = "start|status|stacks|debug|stop"
_session: LiveSession | None = None
_failed: int | None = None  # the rank whose error ended the session's last cell, if one did


def current() -> LiveSession | None:
    return _session


def start(options: RunOptions, idle: float | None, timeline: bool = False) -> str:
    global _session
    if _session is not None and _session.live:
        raise UsageError(
            f"a live session is running ({_session.size} ranks): %horovod stop ends it, "
            "%horovod status shows it"
        )
    if _session is not None:
        _session.end()  # one that ended by itself: its hub closed, its processes confirmed gone
    session = LiveSession(options, idle, timeline)
    summary = session.start()
    _session = session
    return summary


def stop() -> str:
    global _session
    session, _session = _session, None
    if session is None:
        return "no live session"
    leftovers = session.end()
    if leftovers:
        return f"live session stopped; still being stopped: {'; '.join(leftovers)}"
    return f"live session stopped: its {session.size} ranks ended, their slots are free"


atexit.register(stop)  # kernel shutdown or restart: the ranks end with it


def parse_ranks(rank: str | None, ranks: str | None, size: int) -> list[int] | None:
    """``rank=1`` or ``ranks=0,2``: the ranks a cell runs on (all when neither is given)."""
    if rank is not None and ranks is not None:
        raise UsageError("give rank= or ranks=, not both")
    text = rank if rank is not None else ranks
    if text is None:
        return None
    try:
        chosen = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UsageError(f"ranks must be numbers separated by commas, got {text!r}") from None
    wrong = [r for r in chosen if not 0 <= r < size]
    if not chosen or wrong:
        raise UsageError(f"the live session has ranks 0 to {size - 1}; {text!r} names others")
    return chosen


def timeline_ready(value: str | None, options: RunOptions) -> bool:
    """``%horovod start timeline=yes``: the ranks start so that cells can record their timeline."""
    text = (value or "no").lower()
    if text in ("no", "off", "false", "0"):
        return False
    if text not in ("yes", "on", "true", "1"):
        raise UsageError(
            f"timeline={value}: at %horovod start, timeline=yes readies the ranks to record the timeline "
            "of the cells that ask for one (timeline=on|cycles|PATH on the cell)"
        )
    if options.launcher == "torch":
        raise UsageError("timeline= records Horovod's timeline; backend=torch ranks run torch.distributed")
    return True


CellRun = Callable[[Packed, dict[int, str]], tuple[Any, dict[str, Any]]]


def cell_run(given: dict[str, Any]) -> tuple[RunOptions, CellRun]:
    """A cell on the live session (its options, by keyword, checked for a session's cell): its
    options, and how it runs (on the ranks chosen, in their namespaces; filling {rank: host})."""
    assert _session is not None
    session = _alive(_session)
    targets = parse_ranks(given["rank"], given["ranks"], session.size)
    options = session_cell_options(session, given, targets)

    def run(packed: Packed, hosts: dict[int, str]) -> tuple[Any, dict[str, Any]]:
        try:
            value, returned = run_on(session, packed, targets, options)
            return value, returned
        finally:
            live = _session or session
            hosts.update({rank: info.started.host for rank, info in live.ranks.items() if info.started})

    return options, run


def run_on(session: LiveSession, packed: Any, targets: list[int] | None, options: RunOptions) -> Any:
    """The cell on the session; on a new one when its ranks turn out to have left a silent
    notebook (a kernel stopped, or busy holding the GIL, for the silence limit) as the cell was
    sent: they ran no cell after leaving, so it runs once, on the new session. So does a cell
    that found the session ended (``idle=`` ended it as the cell came): it ran nowhere."""
    global _failed
    _failed = None
    try:
        return session.run(packed, targets, options=options)
    except RankFailedError as err:
        _failed = err.rank
        raise
    except SessionEnded:
        return _alive(session).run(packed, targets, options=options)
    except RunError:
        if not session.left_silent():
            raise
        print(
            "hvd_magic: the cell did not run on the ranks that left: it runs on a new session",
            file=sys.stderr,
        )
        return _alive(session).run(packed, targets, options=options)


def _alive(session: LiveSession) -> LiveSession:
    """The session, or a new one in its place when it ended (said, with what that means)."""
    global _session
    if session.live:
        return session
    reason = session.lost
    session.end()
    print(
        f"hvd_magic: the live session ended ({reason}); starting a new one: what earlier cells "
        "defined on the ranks is gone.",
        file=sys.stderr,
    )
    _session = None
    print(start(session.options, session.idle, session.timeline), file=sys.stderr)
    assert _session is not None
    return _session


def session_cell_options(
    session: LiveSession, given: dict[str, Any], targets: list[int] | None
) -> RunOptions:
    """The session's options with this cell's own (``given`` by keyword: ``return_names``,
    ``timeout``, ``timeline`` ...)."""
    try:
        options = cell_options(session.options, given)
    except OptionError as err:
        raise UsageError(str(err)) from None
    if options.timeline:
        refusal = timeline_refusal(session, targets)
        if refusal:
            raise UsageError(refusal)
    return options


def timeline_refusal(session: LiveSession, targets: list[int] | None) -> str | None:
    """Why this session's cell cannot record a timeline, or None when it can."""
    if session.options.launcher == "torch":
        return "timeline= records Horovod's timeline; this session's ranks run torch.distributed"
    if not session.timeline:
        return (
            "this session's ranks cannot record a timeline: Horovod records one only when it starts "
            "for it. %horovod stop, then %horovod start ... timeline=yes (rank 0 then keeps a thread "
            "polling for timeline events while the session lives), and give timeline= on the cells"
        )
    if targets is not None and 0 not in targets:
        return "timeline= is recorded by rank 0 (Horovod's coordinator), and this cell does not run on it"
    return None


def status_text(session: LiveSession | None) -> str:
    if session is None:
        return "no live session: %horovod start np=N starts one"
    if not session.live:
        return f"the live session ended: {session.ended_because}"
    session.refresh()
    now = time.monotonic()
    gpus = any(info.status is not None and info.status.gpu >= 0 for info in session.ranks.values())
    lines = [
        f"live session: {session.size} ranks, up {_duration(now - session.began)}, "
        f"{'Horovod' if session.options.launcher != 'torch' else 'torch.distributed'}",
        f"{'rank':>4}  {'host':<16} {'pid':>7}  {'state':<10} {'cells':>5} {'memory':>9} {'cpu':>6}"
        + ("  gpu" if gpus else ""),
    ]
    for rank in range(session.size):
        info = session.ranks.get(rank)
        if info is None or info.started is None:
            lines.append(f"{rank:>4}  (not started)")
            continue
        status = info.status
        state = "idle" if status is None or not status.busy else f"cell {status.busy}"
        memory = "" if status is None else f"{status.rss / 2**20:,.0f} MB"
        cpu = "" if status is None else f"{status.cpu:.0f} %"
        cells = "" if status is None else str(status.cells)
        host = info.started.host[:16]
        gpu = f"  {status.gpu_text()}" if gpus and status is not None else ""
        lines.append(
            f"{rank:>4}  {host:<16} {info.started.pid:>7}  {state:<10} {cells:>5} {memory:>9} {cpu:>6}{gpu}"
        )
    return "\n".join(lines)


def stacks_text(session: LiveSession | None, timeout: float = stacks.ASK_SECONDS) -> str:
    """Where each of the session's ranks is now (asked from any thread, also while a cell runs)."""
    if session is None:
        return "no live session: %horovod start np=N starts one"
    if not session.live or session.hub is None:
        return f"the live session ended: {session.ended_because}"
    hosts, pids = hosts_and_pids(session.ranks)
    return stacks.where_now(session.hub, session.size, hosts, pids, session.launcher.native_stacks, timeout)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def debug(line: str) -> str:
    """``%horovod debug [rank=N]``: pdb where the live session's last cell failed, on the rank
    whose error ended it (or rank N), as ``%debug`` does for the kernel's own cells."""
    session = _session
    if session is None or not session.live:
        raise UsageError(
            "%horovod debug opens pdb where a rank of a live session's last cell failed, and there is no "
            "live session: a cell of its own (np=) leaves no rank behind. Start one with %horovod start "
            "np=N; or put breakpoint() in the cell"
        )
    chosen = line.strip().removeprefix("rank=")
    if chosen and not chosen.isdigit():
        raise UsageError(f"usage: %horovod debug [rank=N], got {line.strip()!r}")
    rank = int(chosen) if chosen else _failed
    if rank is None:
        raise UsageError("the live session's last cell did not fail: there is nothing to debug")
    parse_ranks(str(rank), None, session.size)  # one of the session's
    value, _ = session.run(Packed(cloudpickle.dumps(PostMortem()), []), [rank])
    return str(value or "")
