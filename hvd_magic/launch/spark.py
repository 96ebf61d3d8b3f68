"""Ranks on Spark executors: one barrier stage, one task per slot (np > 0).

The driver side: find or create the SparkSession, check there are enough slots (fail in
seconds, not after Spark's 10 minutes of barrier retries), submit the barrier job in its own job
group on a thread, answer the tasks' ``join`` with the plan, and release them when mpirun ends.
"""

from __future__ import annotations

import collections
import functools
import os
import queue
import socket
import sys
import threading
import time
import uuid
from typing import Any

from ..errors import LaunchError
from ..hub import Event, Hub, RunKeys
from . import Launcher, LaunchPlan, RankDeath, death_of, mpirun_deaths
from .rendezvous import GlooStore, gloo_slots
from .spark_task import TaskSpec, barrier_task

__all__ = ["SparkLauncher", "active_or_embedded_session", "driver_address", "slots_available"]

SLOT_WAIT_SECONDS = 10.0
JOIN_TIMEOUT = 120.0
STOP_SECONDS = 6.0  # tasks stop their processes: SIGINT, SIGTERM, SIGKILL 1.5 s apart


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


def make_plan(joins: list[dict[str, Any]], launcher: str) -> dict[str, Any]:
    """Group tasks by executor: one host entry per executor, ranks numbered host by host."""
    by_executor: dict[str, list[dict[str, Any]]] = collections.OrderedDict()
    for join in sorted(joins, key=lambda j: int(j["partition"])):
        by_executor.setdefault(str(join["executor"]), []).append(join)
    hosts = []
    for index, (executor, tasks) in enumerate(by_executor.items()):
        hosts.append(
            {
                "token": f"hvd-host-{index}",
                "executor": executor,
                "ip": tasks[0]["ip"],
                "agent": tasks[0].get("agent", ""),
                "partitions": [int(t["partition"]) for t in tasks],
                "gpus": [list(t["gpus"]) for t in tasks],
            }
        )
    plan: dict[str, Any] = {"hosts": hosts, "mpirun_partition": hosts[0]["partitions"][0]}
    if launcher == "gloo":
        partitions = [p for host in hosts for p in host["partitions"]]
        layout = gloo_slots([(host["token"], len(host["partitions"])) for host in hosts])
        plan["slots"] = {str(p): slot for p, slot in zip(partitions, layout, strict=True)}
    return plan


class SparkLauncher(Launcher):
    """One barrier stage of ``np`` tasks on the session's executors."""

    def __init__(self, plan: LaunchPlan, hub: Hub, session: Any, task_cpus: int) -> None:
        self.plan = plan
        self.hub = hub
        self.session = session
        self.task_cpus = task_cpus
        self.group = f"hvd_magic-{uuid.uuid4().hex[:12]}"
        self.exit_code: int | None = None
        self.job_error: str = ""
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._tasks: list[bytes] = []
        self._launcher_exits: list[int] = []
        self._deaths: list[RankDeath] = []  # gloo: ranks whose task saw them end badly
        self._rank_of: dict[bytes, tuple[int, str]] = {}  # task identity -> (rank, host)
        self._released = threading.Event()

    def start(self) -> None:
        check_slots(self.session, self.plan.np)
        spec = TaskSpec(
            np=self.plan.np,
            launcher=self.plan.launcher,
            env=self.plan.env,
            hub_address=self.hub.address,
            hub_token=self.hub.keys.client_token(),
            agent_keys=RunKeys.generate(),
            task_cpus=self.task_cpus,
        )
        self._job = threading.Thread(
            target=self._run_job, args=(spec,), name="hvd_magic-spark-job", daemon=True
        )
        self._job.start()
        self._control = threading.Thread(target=self._rendezvous, name="hvd_magic-rendezvous", daemon=True)
        self._control.start()

    def _run_job(self, spec: TaskSpec) -> None:
        context = self.session.sparkContext
        context.setJobGroup(self.group, f"hvd_magic: {self.plan.np} Horovod ranks", interruptOnCancel=True)
        try:
            rdd = context.parallelize(range(self.plan.np), self.plan.np).barrier()
            codes = rdd.mapPartitions(functools.partial(barrier_task, spec)).collect()
            self.exit_code = max(codes, default=1)
        except Exception as err:  # noqa: BLE001 - py4j errors: keep the first line for the user
            self.job_error = str(err).strip().split("\n")[0][:2000]
            self.exit_code = 1

    def _rendezvous(self) -> None:
        joins: list[Event] = []
        deadline = time.monotonic() + JOIN_TIMEOUT
        while len(joins) < self.plan.np and not self._released.is_set():
            event = self._next_control(deadline)
            if event is None:
                return
            if event.kind == "join":
                joins.append(event)
        if self._released.is_set():
            return
        self._tasks = [e.identity for e in joins]
        plan = make_plan([e.header for e in joins], self.plan.launcher)
        if self.plan.launcher == "gloo":
            self._serve_gloo_store(plan["slots"])
            for event in joins:
                slot = plan["slots"][str(event.header["partition"])]
                self._rank_of[event.identity] = (slot["rank"], slot["hostname"])
        for event in joins:
            self.hub.send_to(event.identity, "plan", plan)
        # mpirun's task reports once; with Gloo every task reports its own rank.
        expected = 1 if self.plan.launcher == "mpi" else self.plan.np
        while not self._released.is_set():
            event = self._next_control(None)
            if event is not None and event.kind == "launcher_exit":
                code = int(event.header.get("code", 1))
                self._launcher_exits.append(code)
                if code and event.identity in self._rank_of:
                    rank, host = self._rank_of[event.identity]
                    self._deaths.append(death_of(rank, code, host))
                if len(self._launcher_exits) >= expected:
                    self.release()

    def _next_control(self, deadline: float | None) -> Event | None:
        while not self._released.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return None
            try:
                event = self.hub.control.get(timeout=0.2)
            except queue.Empty:
                continue
            if event.kind == "launcher_log":
                self.log.append(event.blob.decode("utf-8", errors="replace").rstrip("\n"))
                continue
            return event
        return None

    def _serve_gloo_store(self, slots: dict[str, dict[str, Any]]) -> None:
        """Answer the tasks' relayed Gloo store requests from a store on the driver."""
        store = GlooStore(slots.values())

        def answer(event: Event) -> tuple[str, dict[str, Any], bytes]:
            status, value = store.request(
                str(event.header.get("method")), str(event.header.get("path")), event.blob
            )
            return "stored", {"id": event.header.get("id"), "status": status}, value

        self.hub.responders["store"] = answer

    def release(self, kind: str = "release") -> None:
        """Let every task return (their slots and GPUs go back to Spark); "abort" kills first."""
        self._released.set()
        for identity in self._tasks:
            self.hub.send_to(identity, kind)

    def poll(self) -> int | None:
        if not self._job.is_alive():
            return self.exit_code
        # A failed launcher ends the run now: Spark may be busy retrying the barrier stage
        # (an executor was lost); stop() then cancels the job.
        failed = [code for code in self._launcher_exits if code]
        return failed[0] if failed else None

    def stop(self) -> None:
        if not hasattr(self, "_job"):
            return
        if self._job.is_alive():
            self.release("abort")
            self._job.join(timeout=STOP_SECONDS)
        if self._job.is_alive():
            self.session.sparkContext.cancelJobGroup(self.group)
            self._job.join(timeout=10)
        self._released.set()
        self.hub.responders.pop("store", None)

    def deaths(self) -> list[RankDeath]:
        if self.plan.launcher == "mpi":
            return mpirun_deaths("\n".join(list(self.log)))
        return list(self._deaths)

    def diagnostics(self) -> str:
        parts = list(self.log)
        if self.job_error:
            parts.append(f"Spark job: {self.job_error}")
        return "\n".join(parts)
