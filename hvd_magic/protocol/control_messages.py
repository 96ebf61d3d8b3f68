"""The records that keep a long run's work and show where it is: checkpoints asked back by ranks
that resume, a stop the ranks reach at a step boundary, each rank's stacks asked at any moment,
and a rank's questions to the person at the notebook (``input()``, pdb), and what a rank says of its
own machine (a preemption notice) and of its wait timing (stopped: it cost too much). Kinds are in
``messages``."""

from __future__ import annotations

from dataclasses import dataclass, field

from hvd_magic.protocol.messages import Kind, Record, _kind

__all__ = [
    "DebuggerLeft",
    "KeptAnswer",
    "KeptRequest",
    "Noticed",
    "Polling",
    "Prompt",
    "RankStacks",
    "ResumeAnswer",
    "ResumeRequest",
    "StacksAsked",
    "StopAsked",
    "TimingOff",
    "Typed",
]


@_kind(Kind.RESUME)
@dataclass(frozen=True)
class ResumeRequest(Record):
    """A rank asks for the run's latest whole checkpoint (``hvd_magic.resume()``)."""

    id: int


@_kind(Kind.RESUMED)
@dataclass(frozen=True)
class ResumeAnswer(Record):
    """The latest checkpoint (the blob) and its step; ``found`` is False on a fresh start;
    ``error``: why the notebook could not read its checkpoints."""

    id: int
    step: int = 0
    found: bool = False
    error: str = ""


@_kind(Kind.KEPT_ASK)
@dataclass(frozen=True)
class KeptRequest(Record):
    """Rank 0 asks whether its checkpoint of ``step`` is kept (``checkpoint(..., wait=True)``):
    sent after the checkpoint's last chunk on the same connection, so it is answered after it."""

    id: int
    step: int = 0


@_kind(Kind.KEPT)
@dataclass(frozen=True)
class KeptAnswer(Record):
    """Whether the checkpoint asked about is whole in the run's checkpoint folder."""

    id: int
    kept: bool = False


@_kind(Kind.STOP_ASKED)
@dataclass(frozen=True)
class StopAsked(Record):
    """The notebook asks the ranks to stop at their next step boundary (``hvd_magic.stopping()``);
    ``reason``: a preemption notice (empty: the user's interrupt)."""

    reason: str = ""


@_kind(Kind.POLLING)
@dataclass(frozen=True)
class Polling(Record):
    """A rank calls ``hvd_magic.stopping()``: the run can stop gracefully (sent once); and
    ``stopping``: the ranks agreed to stop (sent once more, when they do)."""

    stopping: bool = False


@_kind(Kind.STACKS_ASKED)
@dataclass(frozen=True)
class StacksAsked(Record):
    """Send your threads' Python stacks now (answered from the rank's inbox thread, so also while
    its cell runs, unless a C call holds the interpreter)."""

    id: int


@_kind(Kind.STACKS)
@dataclass(frozen=True)
class RankStacks(Record):
    """A rank's threads at one moment. ``main``: the main thread's frames, outermost first, each
    ``[file, line, function, source line]``, from the cell's first frame on (empty when the
    rank is idle between a live session's cells); ``others``: each other thread of the user's
    as ``[name, "function (file:line)"]``, its innermost frame."""

    id: int
    main: list[list[str | int]] = field(default_factory=list)
    others: list[list[str]] = field(default_factory=list)
    idle: bool = False


@_kind(Kind.PROMPT)
@dataclass(frozen=True)
class Prompt(Record):
    """A rank asks the person at the notebook for a line: ``text`` is what it wrote since its
    last question, its last line the prompt (``(Pdb) `` when ``debugger``)."""

    id: int
    text: str = ""
    debugger: bool = False


@_kind(Kind.TYPED)
@dataclass(frozen=True)
class Typed(Record):
    """The line typed (without its newline); ``closed``: the notebook takes no input (a
    headless run), nothing was asked."""

    id: int
    line: str = ""
    closed: bool = False


@_kind(Kind.DEBUGGER_LEFT)
@dataclass(frozen=True)
class DebuggerLeft(Record):
    """A rank's pdb continued or quit: ``text`` is what it wrote after its last prompt. Until
    then, other ranks' prompts wait: one rank in the debugger at a time."""

    text: str = ""


@_kind(Kind.NOTICED)
@dataclass(frozen=True)
class Noticed(Record):
    """A rank's machine is about to be taken (a cloud's preemption notice it read): ``text``."""

    text: str = ""


@_kind(Kind.TIMING_OFF)
@dataclass(frozen=True)
class TimingOff(Record):
    """The rank's timing of its waits in collectives cost ``share`` of its ``step`` (seconds, an
    untimed one), over ``limit``: it is off in that rank from now on, which sends no waits
    (``rank.timing_cost``), so the straggler watch judges the ranks by wall time."""

    share: float
    step: float
    limit: float

    def text(self, rank: int) -> str:
        cost = f"{100 * self.share:.1f} % of its {1e3 * self.step:.2f} ms step (over {100 * self.limit:g} %)"
        then = "it is off for this run, and stragglers are judged by wall time"
        return f"rank {rank}'s wait timing cost {cost}; {then}"
