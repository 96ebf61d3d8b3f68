"""The records that keep a long run's work: checkpoints asked back by ranks that resume, and a
stop the ranks reach at a step boundary. Kinds are in ``messages``."""

from __future__ import annotations

from dataclasses import dataclass

from hvd_magic.protocol.messages import Kind, Record, _kind

__all__ = ["Polling", "ResumeAnswer", "ResumeRequest", "StopAsked"]


@_kind(Kind.RESUME)
@dataclass(frozen=True)
class ResumeRequest(Record):
    """A rank asks for the run's latest whole checkpoint (``hvd_magic.resume()``)."""

    id: int


@_kind(Kind.RESUMED)
@dataclass(frozen=True)
class ResumeAnswer(Record):
    """The latest checkpoint (the blob) and its step; ``found`` is False on a fresh start."""

    id: int
    step: int = 0
    found: bool = False


@_kind(Kind.STOP_ASKED)
@dataclass(frozen=True)
class StopAsked(Record):
    """The notebook asks the ranks to stop at their next step boundary (``hvd_magic.stopping()``)."""


@_kind(Kind.POLLING)
@dataclass(frozen=True)
class Polling(Record):
    """A rank calls ``hvd_magic.stopping()``: the run can stop gracefully (sent once)."""
