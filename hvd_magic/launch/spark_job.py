"""A run's Spark job: the barrier stage collected on a thread of its own, under a job tag that a
stop cancels. A run that ended well (or lost a host) returns before Spark has seen its tasks
return (``bench/spark_phases.py`` times both): its job is left to end, and the next launch waits
for it, since it needs the slots."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from hvd_magic.launch import spark_plan
from hvd_magic.launch.spark_session import cancel_tag

__all__ = ["END_SECONDS", "SparkJob", "wait_for_ending_jobs"]

END_SECONDS = 10.0  # for a job to end once its tasks were told to return, or after a cancel


class SparkJob:
    """``stage()`` collected on a thread; ``code`` is the tasks' highest exit code (1 if it failed).
    ``stopping()`` says whether the run was stopping it: Spark's own cancel is told apart, and
    handed to ``spark_stopped`` with the words that say so."""

    def __init__(self, session: Any, tag: str) -> None:
        self.session, self.tag = session, tag
        self.code: int | None = None
        self.error = ""  # Spark's line that says why it failed
        self._thread: threading.Thread | None = None

    def start(
        self, stage: Callable[[], Any], stopping: Callable[[], bool], spark_stopped: Callable[[str], None]
    ) -> None:
        args = (stage, stopping, spark_stopped)
        self._thread = threading.Thread(
            target=self._collect, args=args, name="hvd_magic-spark-job", daemon=True
        )
        self._thread.start()

    def _collect(
        self, stage: Callable[[], Any], stopping: Callable[[], bool], spark_stopped: Callable[[str], None]
    ) -> None:
        self.session.addTag(self.tag)  # this thread's jobs: cancel() interrupts them by the tag
        try:
            self.code = max((int(row[0]) for row in stage().collect()), default=1)
        except Exception as err:  # noqa: BLE001 - py4j/gRPC errors: keep the line that says why
            cancelled = spark_plan.cancelled_by_spark(str(err))
            self.error = cancelled or spark_plan.spark_failure(str(err))
            if cancelled and not stopping():
                spark_stopped(spark_plan.stopped_by_spark(cancelled))
            self.code = 1
        finally:
            self.session.removeTag(self.tag)

    @property
    def started(self) -> bool:
        return self._thread is not None

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self) -> None:
        """Until the job ended, or END_SECONDS."""
        if self._thread is not None:
            self._thread.join(END_SECONDS)

    def end(self) -> None:
        """Wait for the job to end; cancel it (and wait again) if it does not in time."""
        self.join()
        if self.running():  # tasks that never answered, or Spark retrying the stage
            cancel_tag(self.session, self.tag, END_SECONDS)
            self.join()

    def leave(self) -> None:
        """The run ended well: the job ends on its own, and the next launch waits for that."""
        with _ENDING_LOCK:
            _ENDING.append(self)


_ENDING: list[SparkJob] = []
_ENDING_LOCK = threading.Lock()


def wait_for_ending_jobs() -> None:
    """Until the jobs of the runs that ended well have ended (or were cancelled): their slots.
    One at a time, each taken off the list once it ended: an interrupt leaves the rest listed."""
    while True:
        with _ENDING_LOCK:
            if not _ENDING:
                return
            job = _ENDING[0]
        job.end()
        with _ENDING_LOCK:
            if job in _ENDING:
                _ENDING.remove(job)
