"""Ranks on Spark executors: one barrier stage, one task per slot (np > 0).

The driver side: check there are enough slots (fail in seconds, not after Spark's 10 minutes of
barrier retries), submit the barrier job in its own job group on a thread, answer the tasks'
``Join`` with the plan, and release them when the launcher (mpirun, or each Gloo rank) ends.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
import time
import uuid
from typing import Any

from ..hub import Hub, RunKeys
from ..protocol import (
    Abort,
    Join,
    LauncherExit,
    LauncherLog,
    Message,
    Plan,
    PlanHost,
    Record,
    Release,
    SparkPlan,
    StoreAnswer,
    StoreRequest,
)
from .base import Launcher
from .gloo import GlooStore, gloo_slots
from .mpirun import mpirun_deaths
from .processes import RankDeath, death_of
from .spark_session import active_or_embedded_session, check_slots, driver_address, task_cpus
from .spark_task import TaskSpec, barrier_task

__all__ = ["SparkLauncher", "make_plan"]

JOIN_TIMEOUT = 120.0
STOP_SECONDS = 6.0  # tasks stop their processes: SIGINT, SIGTERM, SIGKILL 1.5 s apart


def make_plan(joins: list[Join], launcher: str) -> SparkPlan:
    """Group tasks by executor: one host per executor, ranks numbered host by host."""
    by_executor: dict[str, list[Join]] = collections.OrderedDict()
    for join in sorted(joins, key=lambda j: j.partition):
        by_executor.setdefault(join.executor, []).append(join)
    hosts = [
        PlanHost(
            token=f"hvd-host-{index}",
            executor=executor,
            ip=tasks[0].ip,
            partitions=[t.partition for t in tasks],
            gpus=[list(t.gpus) for t in tasks],
            agent=tasks[0].agent,
        )
        for index, (executor, tasks) in enumerate(by_executor.items())
    ]
    slots = {}
    if launcher == "gloo":
        partitions = [p for host in hosts for p in host.partitions]
        layout = gloo_slots([(host.token, len(host.partitions)) for host in hosts])
        slots = dict(zip(partitions, layout, strict=True))
    return SparkPlan(hosts, mpirun_partition=hosts[0].partitions[0], slots=slots)


class SparkLauncher(Launcher):
    """One barrier stage of ``np`` tasks on the session's executors."""

    def __init__(self, np: int, launcher: str, session: Any) -> None:
        self.np = np
        self.launcher = launcher
        self.session = session
        self.bind_host = driver_address(session)
        self.group = f"hvd_magic-{uuid.uuid4().hex[:12]}"
        self.exit_code: int | None = None
        self.job_error: str = ""
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._tasks: list[bytes] = []
        self._launcher_exits: list[int] = []
        self._deaths: list[RankDeath] = []  # gloo: ranks whose task saw them end badly
        self._rank_of: dict[bytes, tuple[int, str]] = {}  # task identity -> (rank, host)
        self._released = threading.Event()

    @classmethod
    def on_active_session(cls, np: int, launcher: str) -> SparkLauncher:
        return cls(np, launcher, active_or_embedded_session())

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        check_slots(self.session, self.np)
        self.hub = hub
        spec = TaskSpec(
            np=self.np,
            launcher=self.launcher,
            env=env,
            hub_address=hub.address,
            hub_token=hub.keys.client_token(),
            agent_keys=RunKeys.generate(),
            task_cpus=task_cpus(self.session),
        )
        self._job = threading.Thread(
            target=self._run_job, args=(spec,), name="hvd_magic-spark-job", daemon=True
        )
        self._job.start()
        self._control = threading.Thread(target=self._rendezvous, name="hvd_magic-rendezvous", daemon=True)
        self._control.start()

    def _run_job(self, spec: TaskSpec) -> None:
        context = self.session.sparkContext
        context.setJobGroup(self.group, f"hvd_magic: {self.np} Horovod ranks", interruptOnCancel=True)
        try:
            rdd = context.parallelize(range(self.np), self.np).barrier()
            codes = rdd.mapPartitions(functools.partial(barrier_task, spec)).collect()
            self.exit_code = max(codes, default=1)
        except Exception as err:  # noqa: BLE001 - py4j errors: keep the first line for the user
            self.job_error = str(err).strip().split("\n")[0][:2000]
            self.exit_code = 1

    def _rendezvous(self) -> None:
        joins = self._gather_joins()
        if joins is None:
            return
        self._tasks = list(joins)
        plan = make_plan(list(joins.values()), self.launcher)
        if self.launcher == "gloo":
            self._serve_gloo_store(plan)
            for identity, join in joins.items():
                slot = plan.slots[join.partition]
                self._rank_of[identity] = (slot.rank, slot.hostname)
        for identity in joins:
            self.hub.send_to(identity, Plan(plan))
        self._follow_launchers()

    def _gather_joins(self) -> dict[bytes, Join] | None:
        """Every task's ``Join`` by its connection, or None if they did not all come (or the
        run was stopped)."""
        joins: dict[bytes, Join] = {}
        deadline = time.monotonic() + JOIN_TIMEOUT
        while len(joins) < self.np:
            message = self._next_control(deadline)
            if message is None:
                return None
            if isinstance(message.record, Join):
                joins[message.identity] = message.record
        return joins

    def _follow_launchers(self) -> None:
        """Release the tasks once the launchers ended: mpirun's task reports once, Gloo tasks
        each report their own rank."""
        expected = 1 if self.launcher == "mpi" else self.np
        while not self._released.is_set():
            message = self._next_control(None)
            if message is None or not isinstance(message.record, LauncherExit):
                continue
            code = message.record.code
            self._launcher_exits.append(code)
            if code and message.identity in self._rank_of:
                rank, host = self._rank_of[message.identity]
                self._deaths.append(death_of(rank, code, host))
            if len(self._launcher_exits) >= expected:
                self.release()

    def _next_control(self, deadline: float | None) -> Message | None:
        while not self._released.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return None
            try:
                message = self.hub.control.get(timeout=0.2)
            except queue.Empty:
                continue
            if isinstance(message.record, LauncherLog):
                self.log.append(message.blob.decode("utf-8", errors="replace").rstrip("\n"))
                continue
            return message
        return None

    def _serve_gloo_store(self, plan: SparkPlan) -> None:
        """Answer the tasks' relayed Gloo store requests from a store on the driver."""
        store = GlooStore(plan.slots.values())

        def answer(message: Message) -> tuple[Record, bytes]:
            request = message.record
            assert isinstance(request, StoreRequest)
            status, value = store.request(request.method, request.path, message.blob)
            return StoreAnswer(request.id, status), value

        self.hub.responders[StoreRequest] = answer

    def release(self, record: Release | Abort = Release()) -> None:  # noqa: B008 - immutable
        """Let every task return (their slots and GPUs go back to Spark); ``Abort`` kills first."""
        self._released.set()
        for identity in self._tasks:
            self.hub.send_to(identity, record)

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
            self.release(Abort())
            self._job.join(timeout=STOP_SECONDS)
        if self._job.is_alive():
            self.session.sparkContext.cancelJobGroup(self.group)
            self._job.join(timeout=10)
        self._released.set()
        self.hub.responders.pop(StoreRequest, None)

    def deaths(self) -> list[RankDeath]:
        if self.launcher == "mpi":
            return mpirun_deaths("\n".join(list(self.log)))
        return list(self._deaths)

    def diagnostics(self) -> str:
        parts = list(self.log)
        if self.job_error:
            parts.append(f"Spark job: {self.job_error}")
        return "\n".join(parts)
