"""Every exception hvd_magic raises, in one tree.

::

    HorovodMagicError
    ├── CaptureError          the cell or function cannot be shipped to the ranks
    ├── LaunchError           the job could not be started (no mpirun, no slots, bad setup)
    ├── DataError             the data= input cannot be split into shards for the ranks
    ├── TimelineError         a file is not a Horovod Timeline (or is damaged beyond its tail)
    ├── InstallError          Horovod cannot be built or installed here (names what to install)
    └── RunError              the job started but did not finish cleanly
        ├── RankFailedError   a rank raised; carries its rank, host and remote traceback
        ├── RunInterrupted    the user interrupted the run
        ├── RunTimeout        the run stopped making progress within its time limit
        └── SessionEnded      the live session had ended before the cell reached it

A rank's failure has a class (``FailureClass``), named alike in the error, the view, the record
and the retry policy, and said alike by every launcher. Only classes outside the user's code
are retried: a process killed from outside, an executor or host lost, a communication error with
nothing else to blame. The cell's own exception, a native crash and a silent ``exit()`` come from
the code and would come back; so would running out of memory on the same data and batch size.

Messages say what happened, to what, and what to do. ``RankFailedError`` renders as the
remote traceback in IPython (``_render_traceback_``) instead of hvd_magic's own frames.
"""

from __future__ import annotations

import enum
import signal

__all__ = [  # the exception tree; FailureClass (below) is public through hvd_magic
    "CaptureError",
    "CheckpointError",
    "DataError",
    "HorovodMagicError",
    "InstallError",
    "LaunchError",
    "RankFailedError",
    "RunError",
    "RunInterrupted",
    "RunTimeout",
    "SessionEnded",
    "TimelineError",
    "TrainerError",
]


# Signals a process raises on itself when native code fails (faulthandler prints their stack).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})


class FailureClass(enum.Enum):
    """What ended a rank, or the whole run (a Spark cancel), from what was seen (a traceback, an
    exit status, the kernel's records, Spark's word): the value is its name in messages."""

    CODE = "the cell's code raised"
    OOM = "out of memory"
    CRASH = "crashed"
    KILLED = "killed from outside"
    LOST = "executor or host lost"
    CANCELLED = "cancelled in Spark"
    COMMUNICATION = "communication error"
    EXIT = "exited without a word"

    @property
    def retried(self) -> bool:
        """Whether ``retries=`` starts the run again after a failure of this class."""
        return self in (FailureClass.KILLED, FailureClass.LOST, FailureClass.COMMUNICATION)

    @property
    def why_not_retried(self) -> str:
        """Said when a run with retries left ends on this class ('' for retried classes)."""
        return {
            FailureClass.CODE: "the cell's own exception would be raised again",
            FailureClass.OOM: (
                "it would most likely run out of memory again; use smaller batches or fewer ranks "
                "per host, or give the executors more memory (spark.executor.memory, "
                "spark.executor.memoryOverhead)"
            ),
            FailureClass.CRASH: "a crash in native code usually comes back with the same code and data",
            FailureClass.EXIT: "the rank's own code (or a library in it) chose to exit",
            FailureClass.CANCELLED: (
                "Spark cancelled the job: someone asked for it (the Spark UI's kill, cancelAllJobs, its "
                "job group or tag, a Spark Connect client's interrupt), and starting it again would undo "
                "that; or the Spark session shut down, and a new attempt would not run on its cluster"
            ),
        }.get(self, "")


def class_of_signal(number: int) -> FailureClass:
    """A process ended by signal ``number``: crashed (SIGSEGV, SIGABRT, ...) or killed from outside.
    (An OOM kill is also a SIGKILL: only the kernel's records tell it apart.)"""
    return FailureClass.CRASH if number in CRASH_SIGNALS else FailureClass.KILLED


class HorovodMagicError(Exception):
    """Base class of every hvd_magic error."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of our internal frames: the message is the whole story.
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self}", *self._notes()]

    def _notes(self) -> list[str]:
        return list(getattr(self, "__notes__", []))


class CaptureError(HorovodMagicError):
    """The cell or function cannot be turned into a payload for the ranks."""


class LaunchError(HorovodMagicError):
    """The job could not be started."""


class DataError(HorovodMagicError, ValueError):
    """The ``data=`` input cannot be split into shards for the ranks (or a rank has none)."""


class TimelineError(HorovodMagicError, ValueError):
    """The file is not a Horovod Timeline (or is damaged beyond its tail)."""


class TrainerError(HorovodMagicError, ValueError):
    """A trainer's settings do not fit the run (Lightning's ``devices`` and ``num_nodes`` against
    its ranks); the message names the ones to use."""


class CheckpointError(HorovodMagicError):
    """A checkpoint could not be kept or read (``hvd_magic.checkpoint``, ``hvd_magic.resume``);
    the message says why."""


class InstallError(HorovodMagicError):
    """Horovod cannot be built or installed in this environment; the message names the fix."""


class RunError(HorovodMagicError):
    """The job started but did not finish cleanly. ``failure`` is the class of what ended it
    (``FailureClass``: the cell's code, out of memory, a crash, killed, lost, ...) where a rank's
    failure did; None for an interrupt, a timeout or a launch that went wrong. ``cause`` says what
    ended it in a few words ('rank 1 on hostB was killed by signal 9 (SIGKILL)'), as each
    attempt's line of a run with ``retries=`` does."""

    failure: FailureClass | None = None
    cause: str = ""


class RunInterrupted(RunError):
    """The user interrupted the run; every process was stopped."""


class RunTimeout(RunError):
    """The run made no progress within its time limit."""


class SessionEnded(RunError):
    """The live session had ended before the cell was sent to it: the cell ran nowhere."""


class RankFailedError(RunError):
    """A rank raised an exception (or died); the other ranks were stopped.

    ``rank``, ``host``, ``exc_type`` and ``remote_traceback`` describe the first failure.
    """

    failure: FailureClass

    def __init__(
        self,
        rank: int,
        host: str,
        exc_type: str,
        message: str,
        remote_traceback: str,
        stopped: int = 0,
        failure: FailureClass = FailureClass.CODE,
    ) -> None:
        self.failure = failure
        self.rank = rank
        self.host = host
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.stopped = stopped
        super().__init__(self._summary())

    def _summary(self) -> str:
        where = f"rank {self.rank}" + (f" on {self.host}" if self.host else "")
        others = "the other rank was" if self.stopped == 1 else f"the other {self.stopped} ranks were"
        tail = f"; {others} stopped" if self.stopped else ""
        what = f"{self.exc_type}: {self.message}" if self.exc_type else self.message
        if tail:
            what = what.rstrip(".")
        named = "" if self.failure is FailureClass.CODE else f" ({self.failure.value})"
        return f"{where} failed{named}: {what}{tail}"

    def __str__(self) -> str:
        if not self.remote_traceback:  # the rank died without one
            return self._summary()
        return f"{self._summary()}\n\nremote traceback ({self._where()}):\n{self.remote_traceback}"

    def _where(self) -> str:
        return f"rank {self.rank}" + (f" on {self.host}" if self.host else "")

    def _render_traceback_(self) -> list[str]:
        red, reset = "\x1b[31m", "\x1b[0m"
        lines = []
        if self.remote_traceback:
            lines.append(f"{red}--- remote traceback, {self._where()} ---{reset}")
            lines += self.remote_traceback.rstrip("\n").split("\n")
        lines.append(f"{red}RankFailedError{reset}: {self._summary()}")
        return lines + self._notes()
