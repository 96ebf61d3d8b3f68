"""Ranks on Spark executors: one barrier stage, one task per slot (np > 0).

The driver side: check there are enough slots (fail in seconds, not after Spark's 10 minutes of
barrier retries), submit the barrier stage (``mapInArrow(..., barrier=True)``: the DataFrame API
only, so classic and Spark Connect sessions run the same code) under a job tag on a thread,
answer the tasks' ``Join`` with the plan, and release them when the launcher (mpirun, or each
Gloo rank) ends: a run is over once every task confirmed, not when Spark ends the job
(``spark_job``). With ``data=``, the stage runs on the keyed DataFrame: each task has its shard.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hvd_magic.data.parquet import Piece
from hvd_magic.data.source import spark_dataframe, spark_stage
from hvd_magic.hub import Hub, RunKeys
from hvd_magic.launch import native, spark_plan
from hvd_magic.launch.base import HOW, Launcher
from hvd_magic.launch.embedded_spark import active_or_embedded_session, embedded_notice
from hvd_magic.launch.gloo import GlooStore
from hvd_magic.launch.mpirun import lost_node, mpirun_deaths
from hvd_magic.launch.processes import RankDeath
from hvd_magic.launch.spark_job import END_SECONDS, SparkJob, wait_for_ending_jobs
from hvd_magic.launch.spark_session import (
    cancel_tag,
    check_dynamic_allocation,
    check_slots,
    decommissioned,
    described,
    driver_address,
    lost_executors,
    task_cpus,
)
from hvd_magic.launch.task.barrier import STAGE_SCHEMA, TaskSpec, barrier_stage
from hvd_magic.protocol import (
    Abort,
    Join,
    LauncherExit,
    LauncherLog,
    Message,
    Plan,
    Release,
    SparkPlan,
    Stopped,
    StoreRequest,
)

if TYPE_CHECKING:
    from hvd_magic.options import RunOptions

__all__ = ["SparkLauncher"]

STOP_SECONDS = 30.0  # for every task to confirm its stop (SIGINT, SIGTERM, SIGKILL 1.5 s apart)
QUIET_SECONDS = 12.0  # ... but not longer than this after the last confirmation
AFTER_JOB_SECONDS = 2.0  # once the job ended: for confirmations still on their way
ASK_SPARK_SECONDS = 1.0  # how often a stop asks Spark which executors it lost


class SparkLauncher(Launcher):
    """One barrier stage of ``np`` tasks on the session's executors."""

    def __init__(
        self,
        np: int,
        launcher: str,
        session: Any,
        stage_input: Any = None,
        shard_sizes: list[int] | None = None,
        pieces: list[list[Piece]] | None = None,
    ) -> None:
        self.np, self.launcher, self.session = np, launcher, session
        self.stage_input = stage_input  # data=: the keyed DataFrame, one shard per partition
        self.shard_sizes = shard_sizes or []
        self.pieces = pieces or []  # data= a plain Parquet scan: the row ranges each task reads
        self.bind_host, self.tag = driver_address(session), f"hvd_magic-{uuid.uuid4().hex[:12]}"
        self.warm: tuple[str, ...] = ()  # set by for_options
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._joins: dict[bytes, Join] = {}  # task connection -> its Join
        self._stopped: dict[bytes, Stopped] = {}  # task connection -> its confirmation
        self._launcher_exits: list[int] = []
        self._deaths: list[RankDeath] = []  # gloo: ranks whose task saw them end badly
        self._rank_of: dict[bytes, int] = {}  # task connection -> the rank it started
        self._ending: Release | Abort | None = None  # what the tasks were told to do
        self._closed = threading.Event()
        self._job = SparkJob(session, self.tag)
        self._plan: SparkPlan | None = None
        self._lost: list[str] = []  # hosts (plan tokens) mpirun lost: their tasks cannot answer
        self._gone: dict[str, str] = {}  # executors Spark lost, and why: nor can theirs
        self._asked_spark = 0.0

    @classmethod
    def for_options(cls, options: RunOptions, warm: tuple[str, ...] = ()) -> SparkLauncher:
        """On the data's session (``data=`` a Spark DataFrame), else the active or an embedded
        one; the data's shards are planned (and bad data refused) before anything launches.
        ``warm``: what the executors' fork servers preload (``warm.choice``)."""
        data = options.data
        session = getattr(data, "sparkSession", None) or active_or_embedded_session()
        check_dynamic_allocation(session)
        if data is None:
            launcher = cls(options.ranks, options.launcher, session)
        else:
            launcher = cls._with_data(options, session)
        launcher.notices, launcher.warm = embedded_notice() + launcher.notices, warm
        return launcher

    @classmethod
    def _with_data(cls, options: RunOptions, session: Any) -> SparkLauncher:
        df = spark_dataframe(options.data, session)
        stage = spark_stage(df, options.data_name, options.ranks, options.keep_remainder)
        launcher = cls(options.ranks, options.launcher, session, stage.keyed, stage.sizes, stage.pieces)
        launcher.notices = [stage.notice]
        return launcher

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        wait_for_ending_jobs()
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
            run_id=self.tag,
            shard_sizes=self.shard_sizes,
            pieces=self.pieces,
            warm=self.warm,
        )
        said = functools.partial(setattr, self, "ended_by")  # Spark cancelled the job itself, and why
        self._job.start(functools.partial(self._stage, spec), lambda: self._ending is not None, said)
        threading.Thread(target=self._control_loop, name="hvd_magic-spark-control", daemon=True).start()

    def _stage(self, spec: TaskSpec) -> Any:
        source = self.stage_input
        if source is None:
            source = self.session.range(0, self.np, 1, self.np)
        return source.mapInArrow(functools.partial(barrier_stage, spec), STAGE_SCHEMA, barrier=True)

    def _control_loop(self) -> None:
        """Every message the tasks send the driver, until the stop is over."""
        while not self._closed.is_set():
            try:
                self.take(self.hub.control.get(timeout=0.2))
            except queue.Empty:
                continue

    def take(self, message: Message) -> None:
        """One message a task sent the driver (the control loop's, or a test's)."""
        record = message.record
        if isinstance(record, Join):
            self._joined(message.identity, record)
        elif isinstance(record, LauncherLog):
            self.log.append(line := message.blob.decode("utf-8", errors="replace").rstrip("\n"))
            if (node := lost_node(line)) is not None and node not in self._lost:
                self._lost.append(node)
        elif isinstance(record, LauncherExit):
            self._launcher_ended(message.identity, record)
        elif isinstance(record, Stopped):
            self._stopped[message.identity] = record

    def _joined(self, identity: bytes, join: Join) -> None:
        self._joins[identity] = join
        if self._ending is not None:  # the run is being stopped: this task has nothing to do
            self.hub.send_to(identity, self._ending)
        elif len(self._joins) == self.np:
            self._send_plan()

    def _send_plan(self) -> None:
        plan = self._plan = spark_plan.make_plan(list(self._joins.values()), self.launcher)
        if self.launcher == "gloo":
            self.hub.responders[StoreRequest] = GlooStore(plan.slots.values()).answer  # relayed by tasks
        if plan.slots:
            self._rank_of = {task: plan.slots[join.partition].rank for task, join in self._joins.items()}
        for identity in self._joins:
            self.hub.send_to(identity, Plan(plan))

    def _launcher_ended(self, identity: bytes, exit: LauncherExit) -> None:
        """Release the tasks once the launchers ended: mpirun's task reports once, Gloo and torch
        tasks each report their own rank (and what their host saw of its end)."""
        self._launcher_exits.append(exit.code)
        if exit.code and identity in self._rank_of:
            self._deaths.append(spark_plan.task_death(self._rank_of[identity], exit))
        if len(self._launcher_exits) >= (1 if self.launcher == "mpi" else self.np):
            self.release()

    def release(self, record: Release | Abort = Release()) -> None:  # noqa: B008 - immutable
        """Let every task return (their slots and GPUs go back to Spark); ``Abort`` kills first."""
        if self._ending is not None:
            return
        self._ending = record
        for identity in list(self._joins):
            self.hub.send_to(identity, record)

    def poll(self) -> int | None:
        if self._job.started and not self._job.running():
            return self._job.code
        # A failed launcher ends the run now, though Spark may retry the stage: stop() cancels the job.
        failed = [code for code in self._launcher_exits if code]
        if failed or self._lost:  # mpirun may wait long for a lost daemon
            return failed[0] if failed else 1
        return 0 if self._ended_well() else None

    def _ended_well(self) -> bool:
        """Every launcher ended well, and every task, released, confirmed that what it started is
        gone: the run is over, though Spark has yet to end the job (its tasks returning), which
        the next launch waits for instead of this cell (``spark_job``)."""
        return isinstance(self._ending, Release) and len(self._stopped) >= self.np

    def stop(self) -> list[str]:
        """Abort the tasks and wait until each confirmed that what it started is gone."""
        if not self._job.started or self._closed.is_set():
            return self._leftovers()
        self.release(Abort())
        if self._ended_well():  # every task confirmed already: nothing to wait for, or ask Spark
            self._job.leave()
        elif not self._joins:  # no task began (the stage waits for slots): none can confirm
            cancel_tag(self.session, self.tag, END_SECONDS)
            self._job.join()
        else:
            self._wait_for_confirmations()
            if self._lost or self._executors_lost():  # their tasks never end: cancel at once; the
                cancel_tag(self.session, self.tag, END_SECONDS)  # cell says what was lost, and the
                self._job.leave()  # next launch waits for Spark's end of the job
            else:
                self._job.end()
        self._closed.set()
        self.hub.responders.pop(StoreRequest, None)
        return self._leftovers()

    def _wait_for_confirmations(self) -> None:
        """Until all np tasks confirmed (those on a host or executor lost aside). Bounded: a task
        Spark killed (a failed stage) never confirms, so the wait also ends when no confirmation
        came for QUIET_SECONDS, and shortly after the job ended."""
        start = time.monotonic()
        deadline, confirmed = start + STOP_SECONDS, -1
        while len(self._stopped) < self.np - len(self._gone_tasks()) and (now := time.monotonic()) < deadline:
            if len(self._stopped) != confirmed:
                confirmed, deadline = len(self._stopped), min(start + STOP_SECONDS, now + QUIET_SECONDS)
            if self._job.started and not self._job.running():
                deadline = min(deadline, now + AFTER_JOB_SECONDS)
            time.sleep(0.02)

    def _leftovers(self) -> list[str]:
        stopped = {self._joins[identity].partition: said for identity, said in self._stopped.items()}
        gone = self._gone_tasks(fresh=True) if len(stopped) < len(self._joins) else []  # else: not asked
        return spark_plan.leftovers(self._joins.values(), stopped, gone)

    def _gone_tasks(self, fresh: bool = False) -> list[int]:
        """The tasks on a host mpirun lost or an executor Spark lost: they cannot answer."""
        return spark_plan.tasks_on(self._plan, self._lost, self._executors_lost(fresh))

    def _executors_lost(self, fresh: bool = False) -> dict[str, str]:
        """The run's executors Spark lost, and its word why (asked anew if ``fresh``, else once a second)."""
        if self._plan is not None and (fresh or time.monotonic() - self._asked_spark >= ASK_SPARK_SECONDS):
            self._asked_spark = time.monotonic()
            ask = [host.executor for host in self._plan.hosts if not self._gone.get(host.executor)]
            self._gone.update(lost_executors(self.session, ask))
        return self._gone

    def deaths(self) -> list[RankDeath]:
        """Hostless: mpirun and the plan name hosts hvd-host-N; diagnosis takes the rank's own name.
        An executor Spark lost took its ranks with it: named first, as the cause of the rest. A
        host whose daemon mpirun lost (the machine died, or its network) loses all its ranks."""
        first = spark_plan.lost_executor_deaths(self._plan, self.launcher, self._executors_lost(fresh=True))
        if self.launcher != "mpi":
            rest = list(self._deaths)
        elif self._plan is not None and self._lost:
            rest = spark_plan.lost_host_deaths(self._plan, self._lost, self.hub.address.split("//")[-1])
        else:
            rest = [replace(d, host="") for d in mpirun_deaths("\n".join(list(self.log)))]
        named = {death.rank for death in first}
        return first + [death for death in rest if death.rank not in named]

    def native_stacks(self, pids: dict[int, int], hosts: dict[int, str]) -> dict[int, str]:
        """Each dumped on its own host, by the task it runs under."""
        return native.ask_tasks(self.hub, list(self._joins), pids)

    def preempted(self) -> str | None:
        places = {join.executor: join.ip for join in self._joins.values()}
        gone = ", ".join(f"{name} ({places[name]})" for name in decommissioned(self.session, sorted(places)))
        return f"Spark is decommissioning executor {gone}" if gone else None

    def describe(self) -> str:
        return f"{described(self.session)} · {HOW[self.launcher]}"

    def diagnostics(self) -> str:
        return "\n".join([*self.log, *([f"Spark job: {self._job.error}"] if self._job.error else [])])

    def said(self) -> list[str]:
        return [line for line in list(self.log) if line.startswith("hvd_magic:")]
