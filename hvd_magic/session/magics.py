"""The notebook's live session: ``%horovod start|status|stop`` and ``%%horovod`` cells without
``np=`` (the magic module parses, this one keeps the one session of the kernel)."""

from __future__ import annotations

import atexit
import dataclasses
import sys
import time
from typing import Any

from IPython.core.error import UsageError

from ..capture import capture_cell
from ..options import OptionError, RunOptions, parse_names, parse_timeout
from .live import LiveSession

__all__ = ["VERBS", "current", "run_cell", "start", "status_text", "stop"]

VERBS = "start|status|stop"
_session: LiveSession | None = None


def current() -> LiveSession | None:
    return _session


def start(options: RunOptions, idle: float | None) -> str:
    global _session
    if _session is not None and _session.live:
        raise UsageError(
            f"a live session is running ({_session.size} ranks): %horovod stop ends it, "
            "%horovod status shows it"
        )
    session = LiveSession(options, idle)
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


def run_cell(shell: Any, args: Any, cell: str) -> Any:
    """A ``%%horovod`` cell without np=: on the live session's ranks, in their namespaces."""
    global _session
    session = _session
    if session is None:
        raise UsageError(
            "np= is required, e.g. %%horovod np=-2 (ranks on this machine) or np=4 (Spark); or start a "
            "live session once with %horovod start np=N and run cells on it without np="
        )
    for name in ("launcher", "backend", "env", "data", "timeline", "oversubscribe"):
        if getattr(args, name, None) is not None:
            raise UsageError(
                f"{name}= is set when the session starts (%horovod start ... {name}=...), not per cell"
            )
    if not session.live:
        reason = session.lost
        session.end()
        print(
            f"hvd_magic: the live session ended ({reason}); starting a new one: what earlier cells "
            "defined on the ranks is gone.",
            file=sys.stderr,
        )
        _session = None
        print(start(session.options, session.idle), file=sys.stderr)
        session = _session
        assert session is not None
    targets = parse_ranks(args.rank, args.ranks, session.size)
    try:
        names = parse_names(args.return_names)
        options = dataclasses.replace(session.options, timeout=parse_timeout(args.timeout), notices=[])
    except OptionError as err:
        raise UsageError(str(err)) from None
    source = shell.transform_cell(cell)
    captured = capture_cell(source, shell.user_ns, set(shell.user_ns_hidden), names)
    value, returned = session.run(captured, targets, options=options)
    shell.user_ns.update(returned)
    return value


def status_text(session: LiveSession | None) -> str:
    if session is None:
        return "no live session: %horovod start np=N starts one"
    if not session.live:
        return f"the live session ended: {session.lost}"
    session.refresh()
    now = time.monotonic()
    lines = [
        f"live session: {session.size} ranks, up {_duration(now - session.began)}, "
        f"{'Horovod' if session.options.launcher != 'torch' else 'torch.distributed'}",
        f"{'rank':>4}  {'host':<16} {'pid':>7}  {'state':<10} {'cells':>5} {'memory':>9} {'cpu':>6}",
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
        lines.append(
            f"{rank:>4}  {host:<16} {info.started.pid:>7}  {state:<10} {cells:>5} {memory:>9} {cpu:>6}"
        )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
