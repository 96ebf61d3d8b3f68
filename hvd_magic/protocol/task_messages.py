"""The records of the Spark tasks' and the exec agents' kinds (the table of who sends what is in
``messages``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hvd_magic.protocol.messages import Kind, Record, _kind
from hvd_magic.protocol.plan import SparkPlan

__all__ = [
    "Abort", "Exec", "Join", "Kill", "LauncherExit", "LauncherLog", "NativeAsked", "NativeDumps",
    "Output", "Ping", "Plan", "Pong", "Release", "Stopped", "StoreAnswer", "StoreRequest",
]  # fmt: skip


@_kind(Kind.JOIN)
@dataclass(frozen=True)
class Join(Record):
    """A barrier task introduces itself: where it runs, its GPUs, its exec agent (mpi), the
    file its shard of the run's data waits in (data=)."""

    partition: int
    executor: str
    ip: str
    gpus: list[str] = field(default_factory=list)
    python: str = ""
    agent: str = ""
    shard: str = ""
    port: int = 0  # backend=torch: a port the task holds for rank 0's store (``reserve_port``)


@_kind(Kind.PLAN)
@dataclass(frozen=True)
class Plan(Record):
    plan: SparkPlan

    def header(self) -> dict[str, Any]:
        return {"plan": self.plan.to_json()}

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Record:
        return cls(SparkPlan.from_json(header["plan"]))


@_kind(Kind.LAUNCHER_LOG)
@dataclass(frozen=True)
class LauncherLog(Record):
    pass


@_kind(Kind.LAUNCHER_EXIT)
@dataclass(frozen=True)
class LauncherExit(Record):
    """The process a task started ended: its exit status and, when it failed, what the task saw
    on its host (``RankDeath.what``, and its ``FailureClass`` by name)."""

    code: int
    what: str = ""
    failure: str = ""


@_kind(Kind.RELEASE)
@dataclass(frozen=True)
class Release(Record):
    """The run is over: the task returns and its slot goes back to Spark."""


@_kind(Kind.ABORT)
@dataclass(frozen=True)
class Abort(Record):
    """Stop what the task started, then return."""


@_kind(Kind.STOPPED)
@dataclass(frozen=True)
class Stopped(Record):
    """A task stopped everything it started; ``remaining`` lists what it could not (pid: command)."""

    executor: str
    remaining: list[str] = field(default_factory=list)


@_kind(Kind.STORE)
@dataclass(frozen=True)
class StoreRequest(Record):
    id: int
    method: str
    path: str


@_kind(Kind.STORED)
@dataclass(frozen=True)
class StoreAnswer(Record):
    id: int
    status: int


@_kind(Kind.EXEC)
@dataclass(frozen=True)
class Exec(Record):
    command: str


@_kind(Kind.OUTPUT)
@dataclass(frozen=True)
class Output(Record):
    stream: str = "stdout"


@_kind(Kind.PING)
@dataclass(frozen=True)
class Ping(Record):
    pass


@_kind(Kind.PONG)
@dataclass(frozen=True)
class Pong(Record):
    pass


@_kind(Kind.KILL)
@dataclass(frozen=True)
class Kill(Record):
    pass


@_kind(Kind.NATIVE_ASKED)
@dataclass(frozen=True)
class NativeAsked(Record):
    """Dump the native stacks (py-spy) of the ranks among ``pids`` that run under this task:
    ranks whose Python could not answer, on the task's own host."""

    id: int
    ranks: list[int]
    pids: list[int]


@_kind(Kind.NATIVE_DUMPS)
@dataclass(frozen=True)
class NativeDumps(Record):
    """A task's answer: py-spy's dump of each of its ranks asked (none where it has none)."""

    id: int
    ranks: list[int] = field(default_factory=list)
    dumps: list[str] = field(default_factory=list)
