"""The one protocol between the notebook, the Spark tasks, the exec agents and the ranks.

A message is three ZeroMQ frames: its kind, a JSON header (the record's fields and the sender's
rank, -1 for a task or an rsh client) and a blob of raw bytes. Each kind has one typed record
here; nothing else in the package spells a kind. Who sends what:

=============  =======================  ==================  ================================
kind           from → to                record              blob
=============  =======================  ==================  ================================
hello          rank → hub               ``Hello``           —
payload        hub → rank               ``Payload``         the pickled cell or function
started        rank → hub               ``Started``         —
log            rank → hub               ``Log``             stdout/stderr bytes, as written
reports        rank → hub               ``Reports``         JSON list of ``report()`` records
error          rank → hub               ``RankError``       —
stall          rank 0 → hub             ``Stall``           —
waiting        rank → hub               ``Waiting``         —
straggler      run → view, sinks        ``Straggler``       — (the notebook's own, never sent)
result         rank 0 → hub             ``Result``          pickled (value, returned names)
file           rank 0 → hub             ``FileChunk``       whole timeline events, or a piece of a file
exit           rank → hub, agent → rsh  ``Exit``            —
join           task → driver            ``Join``            —
plan           driver → task            ``Plan``            —
launcher_log   task → driver            ``LauncherLog``     a line of mpirun's (or a rank's) output
launcher_exit  task → driver            ``LauncherExit``    —
release        driver → task            ``Release``         —
abort          driver → task            ``Abort``           —
stopped        task → driver            ``Stopped``         —
store_request  task → driver            ``StoreRequest``    a Gloo store PUT body
store_answer   driver → task            ``StoreAnswer``     the stored value
native_asked   driver → task            ``NativeAsked``     —
native_dumps   task → driver            ``NativeDumps``     —
exec           rsh client → agent       ``Exec``            —
output         agent → rsh client       ``Output``          the command's output bytes
ping, pong     rsh client ⇄ agent       ``Ping``, ``Pong``  —
kill           rsh client → agent       ``Kill``            —
cell           hub → session rank       ``Cell``            the pickled cell or function
cell_done      session rank → hub       ``CellDone``        —
interrupt      hub → session rank       ``Interrupt``       —
beat           hub → session rank       ``Beat``            —
rank_status    session rank → hub       ``RankStatus``      —
resume_ask     rank → hub               ``ResumeRequest``   —
resume_reply   hub → rank               ``ResumeAnswer``    the latest checkpoint
stop_asked     hub → rank               ``StopAsked``       —
polling        rank → hub               ``Polling``         —
stacks_asked   hub → rank               ``StacksAsked``     —
rank_stacks    rank → hub               ``RankStacks``      —
kept_ask       rank → hub               ``KeptRequest``     —
kept_reply     hub → rank               ``KeptAnswer``      —
prompt         rank → hub               ``Prompt``          —
typed          hub → rank               ``Typed``           —
debugger_left  rank → hub               ``DebuggerLeft``    —
noticed        rank → hub               ``Noticed``         —
timing_off     rank → hub               ``TimingOff``       —
=============  =======================  ==================  ================================

A new kind is one ``Kind`` member, one record class (the ranks' here, the Spark tasks' and the
exec agents' in ``task_messages``, a live session's in ``session_messages``, checkpoints' and
graceful stops', stacks', prompts' and a rank's notices in ``control_messages``) and one row in this table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, TypeVar, cast

__all__ = [
    "Exit", "FileChunk", "Hello", "Kind", "Log", "Payload", "RankError", "Record", "Reports",
    "Result", "Stall", "Started", "Straggler", "Waiting", "record_type",
]  # fmt: skip


class Kind(str, Enum):
    HELLO = "hello"
    PAYLOAD = "payload"
    STARTED = "started"
    LOG = "log"
    REPORTS = "reports"
    ERROR = "error"
    STALL = "stall"
    WAITING = "waiting"
    STRAGGLER = "straggler"
    RESULT = "result"
    FILE = "file"
    EXIT = "exit"
    JOIN = "join"
    PLAN = "plan"
    LAUNCHER_LOG = "launcher_log"
    LAUNCHER_EXIT = "launcher_exit"
    RELEASE = "release"
    ABORT = "abort"
    STOPPED = "stopped"
    STORE = "store_request"
    STORED = "store_answer"
    EXEC = "exec"
    OUTPUT = "output"
    PING = "ping"
    PONG = "pong"
    KILL = "kill"
    CELL = "cell"
    CELL_DONE = "cell_done"
    INTERRUPT = "interrupt"
    BEAT = "beat"
    RANK_STATUS = "rank_status"
    RESUME = "resume_ask"
    RESUMED = "resume_reply"
    STOP_ASKED = "stop_asked"
    POLLING = "polling"
    STACKS_ASKED = "stacks_asked"
    STACKS = "rank_stacks"
    KEPT_ASK = "kept_ask"
    KEPT = "kept_reply"
    PROMPT = "prompt"
    TYPED = "typed"
    DEBUGGER_LEFT = "debugger_left"
    NOTICED = "noticed"
    TIMING_OFF = "timing_off"
    NATIVE_ASKED = "native_asked"
    NATIVE_DUMPS = "native_dumps"


class Record:
    """Base of the typed records; ``KIND`` names the kind on the wire."""

    KIND: ClassVar[Kind]

    def header(self) -> dict[str, Any]:
        # Every record is a dataclass; the base class is not, so mypy cannot see it.
        return cast(dict[str, Any], dataclasses.asdict(self))  # type: ignore[call-overload]

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Record:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in header.items() if k in names})


R = TypeVar("R", bound=type[Record])
_RECORDS: dict[Kind, type[Record]] = {}


def _kind(kind: Kind) -> Callable[[R], R]:
    def register(cls: R) -> R:
        cls.KIND = kind
        _RECORDS[kind] = cls
        return cls

    return register


def record_type(kind: Kind) -> type[Record]:
    """The record class of ``kind``."""
    return _RECORDS[kind]


@_kind(Kind.HELLO)
@dataclass(frozen=True)
class Hello(Record):
    """A rank's first message; the hub answers with the payload."""


@_kind(Kind.PAYLOAD)
@dataclass(frozen=True)
class Payload(Record):
    pass


@_kind(Kind.STARTED)
@dataclass(frozen=True)
class Started(Record):
    host: str
    pid: int
    local_rank: int
    size: int


@_kind(Kind.LOG)
@dataclass(frozen=True)
class Log(Record):
    stream: str = "stdout"  # or "stderr"


@_kind(Kind.REPORTS)
@dataclass(frozen=True)
class Reports(Record):
    dropped: int = 0  # records this rank dropped so far (its buffer was full)


@_kind(Kind.ERROR)
@dataclass(frozen=True)
class RankError(Record):
    host: str = ""
    exc_type: str = "Exception"
    message: str = ""
    traceback: str = ""


@_kind(Kind.STALL)
@dataclass(frozen=True)
class Stall(Record):
    """``ranks`` never ``action`` ``tensors[i]`` while the other ranks waited more than
    ``threshold`` seconds for them. ``source`` says who saw it: Horovod's stall inspector (on
    rank 0), or "" for the notebook's own watch of torch.distributed ranks (``Waiting``)."""

    ranks: list[int]
    tensors: list[list[str]]
    threshold: float
    action: str = "submitted"  # torch.distributed: "reached"
    source: str = "Horovod"

    def missing(self) -> str:
        """'rank 0 never submitted allreduce.t3; rank 2 never submitted ...'"""
        pairs = zip(self.ranks, self.tensors, strict=True)
        return "; ".join(f"rank {rank} never {self.action} {', '.join(tensors)}" for rank, tensors in pairs)


@_kind(Kind.WAITING)
@dataclass(frozen=True)
class Waiting(Record):
    """A torch.distributed rank has been inside ``call`` (``init_process_group``, ``all_reduce``,
    a DDP backward...) for ``seconds``, called from ``where``; an empty ``call`` says it came out."""

    call: str = ""
    where: str = ""
    seconds: float = 0.0


@_kind(Kind.STRAGGLER)
@dataclass(frozen=True)
class Straggler(Record):
    """Rank ``slow_rank`` (on ``host``) has made ``rate`` steps/s, below ``fraction`` of the
    ranks' median ``median``, for ``seconds``; ``reason`` is its likely cause from what its
    resources show. ``recovered``: it is back at or above the fraction (the same rank, named
    earlier). ``outside``: the share of its time spent outside collectives, where the ranks
    measure their waits in them (then the rates are per second of that time; -1: not measured,
    wall time). (Not ``rank``: a message's header has the sender's.)"""

    slow_rank: int
    host: str
    rate: float
    median: float
    fraction: float
    seconds: float
    reason: str = ""
    recovered: bool = False
    outside: float = -1.0

    def text(self) -> str:
        who = f"rank {self.slow_rank}" + (f" ({self.host})" if self.host else "")
        clock = " of its own work (outside collectives)" if self.outside >= 0 else ""
        speeds = f"{self.rate:.2f} steps/s{clock}, the ranks' median {self.median:.2f}"
        if self.recovered:
            return f"{who} caught up: {speeds}"
        share = f"{self.fraction:.0%} of the median for {self.seconds:g} s"
        return f"{who} is a straggler: {speeds} (below {share}); likely {self.reason}"


@_kind(Kind.RESULT)
@dataclass(frozen=True)
class Result(Record):
    pass


@_kind(Kind.FILE)
@dataclass(frozen=True)
class FileChunk(Record):
    name: str
    last: bool = False


@_kind(Kind.EXIT)
@dataclass(frozen=True)
class Exit(Record):
    """The rank ended (a live session's rank: ended its cell). ``skipped``: a live session's
    rank that is not part of the cell (``rank=``/``ranks=``), done with it at once; only the
    notebook makes these."""

    code: int
    skipped: bool = False
