"""The Spark side a run needs before it launches: the session (the active one, classic or Spark
Connect, or an embedded local one), the address the executors reach the notebook at, and the
checks that fail in seconds what Spark would retry for minutes: too few slots, dynamic
allocation (which barrier mode refuses).

On a Spark Connect session there is no SparkContext here: everything goes through the
DataFrame API and the session's configuration, and the slots are counted from it."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from hvd_magic.errors import LaunchError

__all__ = [
    "cancel_tag",
    "check_dynamic_allocation",
    "check_slots",
    "described",
    "driver_address",
    "dynamic_allocation_on",
    "is_connect",
    "slots_available",
    "slots_within",
    "wait_for_slots",
    "task_cpus",
]

SLOT_WAIT_SECONDS = 10.0
ENV_DRIVER_HOST = "HVD_MAGIC_DRIVER_HOST"  # the notebook's address as the executors reach it


def cancel_tag(session: Any, tag: str, timeout: float) -> bool:
    """Cancel the Spark jobs tagged ``tag``; whether Spark took the cancel within ``timeout``
    seconds. Bounded: a Spark Connect client retries a call its server does not answer for
    minutes, and a stop must not wait on that (the caller then finds the job still running)."""
    answered, took = threading.Event(), []

    def cancel() -> None:
        try:
            session.interruptTag(tag)
            took.append(True)
        except Exception:  # noqa: BLE001, S110 - a session already gone has no jobs to cancel
            pass
        finally:
            answered.set()

    threading.Thread(target=cancel, name="hvd_magic-cancel", daemon=True).start()
    return answered.wait(timeout) and bool(took)


def is_connect(session: Any) -> bool:
    """A Spark Connect session (no SparkContext, no JVM in this process for it)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def described(session: Any) -> str:
    """Where a run's ranks went: ``Spark MASTER``, or ``Spark Connect sc://HOST:PORT`` (the server
    the client talks to; the parameters of its URL, a token among them, left out)."""
    try:
        if not is_connect(session):
            return f"Spark {conf(session, 'spark.master')}"
        client = session.client  # pyspark 4's DefaultChannelBuilder says HOST:PORT; else the host
        return f"Spark Connect sc://{getattr(client._builder, 'endpoint', None) or client.host}"
    except Exception:  # noqa: BLE001 - a stopped session, a client without them: what is sure
        return "Spark Connect" if is_connect(session) else "Spark"


def conf(session: Any, key: str, default: str | None = None) -> str | None:
    """A setting of the session's Spark configuration. The session's own conf holds the
    context's settings too, on classic and Connect sessions alike; it is one call per key
    (``sparkContext.getConf()`` copies the whole configuration, a py4j call per entry)."""
    return session.conf.get(key, default)  # type: ignore[no-any-return]


def driver_address(session: Any) -> str:
    """Where the run's hub listens: an address of this machine the executors reach.
    ``HVD_MAGIC_DRIVER_HOST`` chooses it; else the driver's host (classic), or the address
    this machine uses toward the Spark Connect server."""
    host = os.environ.get(ENV_DRIVER_HOST)
    if not host and is_connect(session):
        server = session.client.host  # where the client connects: public, documented
        local = server in ("localhost", "::1") or server.startswith("127.")
        host = "127.0.0.1" if local else _route_to(server)
    host = host or conf(session, "spark.driver.host") or socket.gethostname()
    try:
        return socket.gethostbyname(host)
    except OSError as err:
        raise LaunchError(
            f"the notebook's address {host!r} does not resolve ({err}); set {ENV_DRIVER_HOST} to an "
            "address of this machine that the executors reach"
        ) from None


def _route_to(host: str) -> str:
    """The local address the kernel uses to reach ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(host), 9))
        return str(probe.getsockname()[0])


def dynamic_allocation_on(master: str, enabled: str | None) -> bool:
    """Whether Spark runs this cluster with dynamic allocation (it ignores the setting in local
    mode, ``local`` and ``local[...]``, but not on ``local-cluster`` or a real cluster)."""
    local = master == "local" or master.startswith("local[")
    return (enabled or "false").strip().lower() == "true" and not local


def check_dynamic_allocation(session: Any) -> None:
    """Barrier mode refuses dynamic allocation: say so before anything is launched."""
    if dynamic_allocation_on(
        conf(session, "spark.master") or "", conf(session, "spark.dynamicAllocation.enabled")
    ):
        raise LaunchError(
            "this Spark cluster has dynamic allocation on (spark.dynamicAllocation.enabled=true), and "
            "Spark's barrier mode, which runs the ranks, refuses it. Start the cluster (or a cluster "
            "policy) with spark.dynamicAllocation.enabled=false and a fixed spark.executor.instances, "
            "or run on this machine with np=-N."
        )


def slots_available(session: Any) -> int | None:
    """Barrier tasks that can run at once; None when a Connect session does not tell."""
    if is_connect(session):
        return _slots_from_conf(session)
    jsc = session.sparkContext._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def _slots_from_conf(session: Any) -> int | None:
    """What the master URL or the static executor settings give, divided by spark.task.cpus."""
    master = conf(session, "spark.master") or ""
    cores: int | None = None
    if found := re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master):
        count = found.group(1)
        cores = 1 if count is None else (os.cpu_count() or 1) if count == "*" else int(count)
    elif found := re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master):
        cores = int(found.group(1)) * int(found.group(2))
    elif (instances := conf(session, "spark.executor.instances")) and (
        per_executor := conf(session, "spark.executor.cores")
    ):
        cores = int(instances) * int(per_executor)
    return None if cores is None else cores // task_cpus(session)


def wait_for_slots(session: Any, np: int, wait: float = SLOT_WAIT_SECONDS) -> int | None:
    """The slots, once there are ``np`` or after ``wait`` seconds: executors of a session that
    has just started are still registering."""
    return slots_within(lambda: slots_available(session), np, time.monotonic() + wait, 0.25)


def slots_within(read: Callable[[], int | None], need: int, deadline: float, poll: float) -> int | None:
    """The slots ``read`` counts, once there are ``need`` or at ``deadline`` (monotonic); None
    where the cluster does not tell."""
    while True:
        there = read()
        if there is None or there >= need or time.monotonic() >= deadline:
            return there
        time.sleep(poll)


def slot_wait(session: Any, np: int, wait: float = SLOT_WAIT_SECONDS) -> float:
    """How long to wait for executors to register before the slots are counted: none where the
    configuration allows fewer than ``np`` at most (the master URL's, or static executors')."""
    ceiling = _slots_from_conf(session)
    return 0.0 if ceiling is not None and ceiling < np else wait


def check_slots(session: Any, np: int, wait: float = SLOT_WAIT_SECONDS) -> None:
    """Raise LaunchError unless ``np`` barrier tasks can run at once (executors may still join)."""
    slots = wait_for_slots(session, np, slot_wait(session, np, wait))
    if slots is None or slots >= np:
        return
    gpus = conf(session, "spark.task.resource.gpu.amount")
    per_task = f"spark.task.cpus={task_cpus(session)}" + (
        f", spark.task.resource.gpu.amount={gpus}" if gpus else ""
    )
    if is_connect(session):
        where = f"(spark.master={conf(session, 'spark.master')}; {per_task})"
    else:
        executors = session.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        where = f"({executors} executor JVMs incl. the driver's; {per_task})"
    use = f"Use np={slots} or fewer, or add"
    if not slots:
        use = "No executor offers a slot now: check the cluster, or add"
    raise LaunchError(
        f"np={np} needs {np} task slots at once, but the Spark cluster has {slots} {where}. {use} "
        f"executors or cores (spark.executor.instances, spark.executor.cores), or run locally with np=-{np}."
    )


def task_cpus(session: Any) -> int:
    return int(conf(session, "spark.task.cpus") or "1")


def decommissioned(session: Any, executors: list[str]) -> list[str]:
    """Which of ``executors`` Spark is decommissioning (a worker told to leave, SIGPWR on a
    standalone worker, a Kubernetes pod's termination: ``spark.decommission.enabled``); none
    where the session does not tell (Connect)."""
    if is_connect(session) or not executors:
        return []
    try:  # Spark's own calls; a session stopped by another thread has no _jsc: it tells nothing
        scheduler = session.sparkContext._jsc.sc().taskScheduler()
        return [name for name in executors if scheduler.getExecutorDecommissionState(name).isDefined()]
    except Exception:  # noqa: BLE001 - py4j's errors, or an AttributeError of the stopped session
        return []


def lost_executors(session: Any, executors: list[str]) -> dict[str, str]:
    """Which of ``executors`` Spark has lost, each with its word for why (``Command exited with
    code 137``, ``worker lost: ... disassociated``; empty until its status store has it); none
    where the session does not tell (Connect), and no name Spark never had (local mode's tasks
    name their address)."""
    if is_connect(session) or not executors:
        return {}
    try:  # Spark's own calls (private[spark]): a Spark without them, or a stopped session, tells nothing
        context = session.sparkContext._jsc.sc()
        gone = {name for name in executors if not context.taskScheduler().isExecutorAlive(name)}
        listed = context.statusStore().executorList(False) if gone else None  # False: the removed too
        known = {}
        for summary in (listed.apply(index) for index in range(listed.size())) if listed else ():
            if summary.id() in gone:
                reason = summary.removeReason()
                known[str(summary.id())] = str(reason.get()) if reason.isDefined() else ""
        return known
    except Exception:  # noqa: BLE001 - py4j's errors, or no such method in this Spark
        return {}
