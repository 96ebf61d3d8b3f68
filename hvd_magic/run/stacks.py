"""Where every rank is: each rank's stacks asked over its inbox connection and told as one text,
ranks with the same stack shown once (``%horovod stacks``, ``Session.stacks()``, and the run's
own asking when it is declared stalled, timed out, or interrupted while quiet)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import cast

from hvd_magic.hub import Hub, Replies
from hvd_magic.launch.base import Launcher
from hvd_magic.protocol import CELL_FILENAME, RankStacks, StacksAsked

__all__ = ["ASK_SECONDS", "ask", "describe", "where_each_rank", "where_now"]

ASK_SECONDS = 3.0  # how long the run waits for the ranks' stacks before it goes on without
SHOWN_FRAMES = 8  # the innermost frames of a stack shown; the rest are counted
NATIVE_LINES = 40  # of py-spy's dump of a rank that could not answer
Native = Callable[[dict[int, int], dict[int, str]], dict[int, str]]  # (pids, hosts) → each rank's dump


def ask(hub: Hub, ranks: Iterable[int], timeout: float = ASK_SECONDS) -> dict[int, RankStacks]:
    """The stacks of ``ranks`` that answer within ``timeout`` seconds (from any thread: the answers
    are taken on the hub's thread, never queued as the run's events)."""
    inboxes = dict(hub.inboxes)
    wanted = {rank for rank in ranks if rank in inboxes}  # the others cannot be asked

    def send(asked: int) -> None:
        for rank in wanted:
            hub.send_to(inboxes[rank], StacksAsked(asked))

    answers = Replies.of(hub, RankStacks).ask(send, lambda got: wanted <= {m.rank for m in got}, timeout)
    return {message.rank: cast(RankStacks, message.record) for message in answers}


def _place(frame: list[str | int]) -> str:
    file, line, function, _ = frame
    if file == CELL_FILENAME:
        return f"line {line} of the cell" + ("" if function == "<module>" else f", in {function}")
    return f"{function} ({Path(str(file)).name}:{line})"


def _stack_lines(stacks: RankStacks) -> list[str]:
    if stacks.idle:
        lines = ["  idle: between cells"]
    elif not stacks.main:
        lines = ["  (no Python frame: not yet in the cell)"]
    else:
        shown = stacks.main[-SHOWN_FRAMES:]
        hidden = len(stacks.main) - len(shown)
        lines = [f"  … {hidden} outer frames"] if hidden else []
        for frame in shown:
            source = f": {frame[3]}" if frame[3] else ""
            lines.append(f"  {_place(frame)}{source}")
    lines += [f"  thread {name!r}: in {where}" for name, where in stacks.others]
    return lines


def _headline(stacks: RankStacks) -> str:
    """Innermost: where the rank waits; and the cell's line it waits from."""
    if stacks.idle or not stacks.main:
        return "idle" if stacks.idle else "starting"
    innermost = stacks.main[-1]
    in_cell = [frame for frame in stacks.main if frame[0] == CELL_FILENAME]
    where = f"in {_place(innermost)}"
    if in_cell and in_cell[-1] is not innermost:
        where += f", from {_place(in_cell[-1])}"
    return where


def describe(
    answers: dict[int, RankStacks],
    ranks: Iterable[int],
    hosts: dict[int, str] | None = None,
    pids: dict[int, int] | None = None,
    native: Native | None = None,
) -> str:
    """Every rank's stack, the same stacks once: "ranks 0, 2: in wait (…), from line 12 of
    the cell" and the frames; ranks that did not answer said so, with py-spy's native dump where
    ``native`` (a launcher's ``native_stacks``; by default: of the ranks on this machine) can
    take one on the rank's host and py-spy is installed there."""
    hosts, pids = hosts or {}, pids or {}
    groups: dict[tuple[object, ...], list[int]] = {}
    for rank, stacks in sorted(answers.items()):
        key = (stacks.idle, tuple(tuple(f[:3]) for f in stacks.main), tuple(map(tuple, stacks.others)))
        groups.setdefault(key, []).append(rank)
    lines = []
    for members in groups.values():
        who = f"rank {members[0]}" if len(members) == 1 else f"ranks {', '.join(map(str, members))}"
        seen_on = {hosts[rank] for rank in members if rank in hosts}
        where = f" on {', '.join(sorted(seen_on))}" if seen_on else ""
        stacks = answers[members[0]]
        lines.append(f"{who}{where}: {_headline(stacks)}")
        lines += _stack_lines(stacks)
    silent = sorted(set(ranks) - set(answers))
    asked = {rank: pids[rank] for rank in silent if rank in pids}
    dumps = (native or Launcher().native_stacks)(asked, hosts) if asked else {}
    for rank in silent:
        on = f" on {hosts[rank]}" if rank in hosts else ""
        if rank in dumps:
            lines.append(
                f"rank {rank}{on}: no answer from its Python (a C call holds its lock); py-spy dump --native:"
            )
            dump = dumps[rank].splitlines()
            lines += [f"  {line}" for line in dump[:NATIVE_LINES]]
            lines += [f"  … {len(dump) - NATIVE_LINES} more lines"] if len(dump) > NATIVE_LINES else []
            continue
        pid = f" {pids[rank]}" if rank in pids else " PID"
        lines.append(
            f"rank {rank}{on}: no answer (a C call holding Python's lock, or the rank is gone; "
            f"`py-spy dump --native --pid{pid}` on its host shows its native frames)"
        )
    return "\n".join(lines)


def where_now(
    hub: Hub,
    ranks: int,
    hosts: dict[int, str],
    pids: dict[int, int],
    native: Native | None = None,
    timeout: float = ASK_SECONDS,
) -> str:
    """Every rank of the hub asked, and the answers told (``describe``)."""
    return describe(ask(hub, range(ranks), timeout), range(ranks), hosts, pids, native)


def where_each_rank(
    hub: Hub, ranks: int, hosts: dict[int, str], pids: dict[int, int], native: Native, when: str
) -> str:
    """The run's own asking (at a stall, a timeout, an interrupt of a quiet run): a paragraph
    to add to what it says then."""
    return f"\n\nWhere each rank was {when}:\n" + where_now(hub, ranks, hosts, pids, native)
