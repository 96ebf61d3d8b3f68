"""The classes of a rank's failure, named alike in the error, the view, the record and the retry
policy (``retries=``), and said alike by every launcher (the notebook's, a Spark task's).

Only classes outside the user's code are retried: a process killed from outside, an executor or
host lost, a communication error with nothing else to blame. The cell's own exception, a native
crash and a silent ``exit()`` come from the code and would come back; so would running out of
memory on the same data and batch size, so an OOM is not retried either (its error says what
to change instead).
"""

from __future__ import annotations

import enum
import signal

__all__ = ["CRASH_SIGNALS", "FailureClass", "class_of_signal"]

# Signals a process raises on itself when native code fails (faulthandler prints their stack).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})


class FailureClass(enum.Enum):
    """What ended a rank, from what was seen (a traceback, an exit status, the kernel's records,
    Spark's word): the value is its name in messages."""

    CODE = "the cell's code raised"
    OOM = "out of memory"
    CRASH = "crashed"
    KILLED = "killed from outside"
    LOST = "executor or host lost"
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
        }.get(self, "")


def class_of_signal(number: int) -> FailureClass:
    """A process ended by signal ``number``: crashed (SIGSEGV, SIGABRT, ...) or killed from outside.
    (An OOM kill is also a SIGKILL: only the kernel's records tell it apart.)"""
    return FailureClass.CRASH if number in CRASH_SIGNALS else FailureClass.KILLED
