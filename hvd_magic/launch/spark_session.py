"""The Spark side a run needs before it launches: the session (the active one, or an embedded
local one), the driver's address for the hub, and enough free slots for a barrier stage."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from ..errors import LaunchError

__all__ = ["active_or_embedded_session", "check_slots", "driver_address", "slots_available", "task_cpus"]

SLOT_WAIT_SECONDS = 10.0


def active_or_embedded_session() -> Any:
    """The active SparkSession, or an embedded local one using this Python on the executors."""
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
    return session


def driver_address(session: Any) -> str:
    host = session.sparkContext.getConf().get("spark.driver.host") or socket.gethostname()
    return socket.gethostbyname(host)


def slots_available(session: Any) -> int:
    jsc = session.sparkContext._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def check_slots(session: Any, np: int, wait: float = SLOT_WAIT_SECONDS) -> None:
    """Raise LaunchError unless ``np`` barrier tasks can run at once (executors may still join)."""
    deadline = time.monotonic() + wait
    while (slots := slots_available(session)) < np and time.monotonic() < deadline:
        time.sleep(0.25)
    if slots >= np:
        return
    conf = session.sparkContext.getConf()
    executors = session.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
    task_cpus = conf.get("spark.task.cpus", "1")
    gpus = conf.get("spark.task.resource.gpu.amount")
    per_task = f"spark.task.cpus={task_cpus}" + (f", spark.task.resource.gpu.amount={gpus}" if gpus else "")
    use = (
        f"Use np={slots} or fewer, or add"
        if slots
        else "No executor offers a slot now: check the cluster, or add"
    )
    raise LaunchError(
        f"np={np} needs {np} task slots at once, but the Spark cluster has {slots} "
        f"({executors} executor JVMs incl. the driver's; {per_task}). {use} executors or cores "
        f"(spark.executor.instances, spark.executor.cores), or run locally with np=-{np}."
    )


def task_cpus(session: Any) -> int:
    return int(session.sparkContext.getConf().get("spark.task.cpus", "1"))
