"""The embedded Spark session: a local one that a ``np > 0`` cell starts where no session is
active, its JVM's output kept out of the cell, and a start that is interrupted (the JVM takes
seconds to come up) leaving no JVM behind."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import psutil

from hvd_magic.errors import LaunchError

__all__ = ["active_or_embedded_session", "embedded_notice"]

_EMBEDDED: list[str] = []  # the notice of the embedded session, until it is told


def active_or_embedded_session() -> Any:
    """The active SparkSession, or an embedded local one using this Python on the executors.
    The embedded JVM's own output (log4j's start-up lines, warnings) goes to a log file, not
    into the cell: ``embedded_notice`` says where, once."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise LaunchError(
            "np > 0 runs on Spark, but pyspark is not installed: `pip install pyspark`."
        ) from None
    session = SparkSession.getActiveSession()
    if session is not None:
        return session
    # Executors take PYSPARK_PYTHON from the environment when the context starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # our own session: stay on loopback
    slots = max(4, os.cpu_count() or 1)
    log = os.path.join(tempfile.gettempdir(), f"hvd_magic-spark-{os.getpid()}.log")
    with _output_to(log), _no_jvm_left_if_interrupted():  # the JVM starts here, keeps these descriptors
        session = (
            SparkSession.builder.master(f"local[{slots}]")
            .appName("hvd_magic")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    _EMBEDDED.append(f"started an embedded Spark session (local[{slots}]); its JVM log: {log}")
    return session


def embedded_notice() -> list[str]:
    """Once: where the embedded session's JVM log is (empty otherwise)."""
    told, _EMBEDDED[:] = list(_EMBEDDED), []
    return told


@contextlib.contextmanager
def _no_jvm_left_if_interrupted() -> Iterator[None]:
    """A start that does not finish (an interrupt while PySpark waits for the JVM it launched)
    ends what it started. PySpark leaves that JVM running (it ignores SIGINT), and one whose
    gateway lost its connection file never reads the stdin whose end would stop it: it outlived
    the kernel. The next cell starts a session anew."""
    before = {child.pid for child in psutil.Process().children()}
    try:
        yield
    except BaseException:
        from pyspark import SparkContext

        started = [
            child for child in psutil.Process().children() if child.pid not in before and _spark(child)
        ]
        family: list[psutil.Process] = []
        for process in started:
            with contextlib.suppress(psutil.Error):  # ended meanwhile
                family += process.children(recursive=True)
            family.append(process)
        for member in family:
            with contextlib.suppress(psutil.Error):
                member.kill()
        psutil.wait_procs(family, timeout=10)
        if SparkContext._active_spark_context is None:  # no context: forget a gateway to that JVM
            SparkContext._gateway = SparkContext._jvm = None
        raise


def _spark(process: psutil.Process) -> bool:
    """Spark's launcher script or the JVM it became (not a process another thread started)."""
    try:
        return process.name() == "java" or any("spark" in part for part in process.cmdline()[:2])
    except psutil.Error:
        return False


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Points this process's file descriptors 1 and 2 at ``path`` for the block: a child
    started in it (the JVM) writes there for good; this process gets its own back."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (log, *saved):
            os.close(fd)
