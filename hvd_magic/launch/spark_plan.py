"""The plan the driver hands every barrier task, from the tasks' ``Join`` records, and what a
failed stage or a lost host means for the run's ranks: pure."""

from __future__ import annotations

import collections
import itertools
import re
from collections.abc import Collection

from hvd_magic.errors import FailureClass
from hvd_magic.launch.gloo import gloo_slots
from hvd_magic.launch.processes import RankDeath, death_of
from hvd_magic.protocol import Join, LauncherExit, PlanHost, SparkPlan, Stopped

__all__ = [
    "cancelled_by_spark",
    "leftovers",
    "lost_executor_deaths",
    "lost_host_deaths",
    "make_plan",
    "mpi_ranks",
    "spark_failure",
    "stopped_by_spark",
    "task_death",
    "tasks_on",
]


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
            shards=[t.shard for t in tasks] if any(t.shard for t in tasks) else [],
        )
        for index, (executor, tasks) in enumerate(by_executor.items())
    ]
    slots, first = {}, hosts[0].partitions[0]
    if launcher in ("gloo", "torch"):  # every task starts its own rank
        partitions = [p for host in hosts for p in host.partitions]
        layout = gloo_slots([(host.token, len(host.partitions)) for host in hosts])
        slots = dict(zip(partitions, layout, strict=True))
    master_port = next(join.port for join in joins if join.partition == first)
    return SparkPlan(hosts, mpirun_partition=first, slots=slots, master_port=master_port)


def mpi_ranks(plan: SparkPlan) -> dict[str, list[int]]:
    """Each host's ranks under mpirun (``-H token:slots --map-by slot``): host by host, in order."""
    ranks, first = {}, 0
    for host in plan.hosts:
        ranks[host.token] = list(range(first, first + len(host.partitions)))
        first += len(host.partitions)
    return ranks


def tasks_on(plan: SparkPlan | None, nodes: list[str], executors: Collection[str] = ()) -> list[int]:
    """The partitions (tasks) on the hosts ``nodes`` (plan tokens) or on the ``executors``."""
    if plan is None:
        return []
    hosts = [host for host in plan.hosts if host.token in nodes or host.executor in executors]
    return [partition for host in hosts for partition in host.partitions]


def lost_executor_deaths(plan: SparkPlan | None, launcher: str, lost: dict[str, str]) -> list[RankDeath]:
    """Every rank of each executor Spark lost (``lost``: its id and Spark's word for why)."""
    if plan is None or not lost:
        return []
    mpi, deaths = mpi_ranks(plan) if launcher == "mpi" else {}, []
    for host in (h for h in plan.hosts if h.executor in lost):
        ranks = mpi.get(host.token) or [plan.slots[p].rank for p in host.partitions]
        listed = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        why = f" ({lost[host.executor]})" if lost[host.executor] else ""
        what = f"was lost with executor {host.executor} on {host.ip} ({listed}): Spark lost the executor{why}"
        deaths += [RankDeath(rank, what, host_lost=True, failure=FailureClass.LOST) for rank in ranks]
    return deaths


def cancelled_by_spark(text: str) -> str | None:
    """Spark's word when the job was cancelled (its UI's kill, ``cancelAllJobs``, a job group or
    tag cancelled): 'Job 3 cancelled as part of cancellation of all jobs'; on Spark Connect (an
    ``interruptAll``, ``interruptOperation`` or ``interruptTag`` of another client):
    'OPERATION_CANCELED: Operation has been canceled'; else None."""
    found = re.search(r"(Job \d+ cancelled.*?)(?: SQLSTATE: \w+)?\s*$", text, re.M)
    if found:
        return found.group(1)
    found = re.search(r"\[(OPERATION_CANCELED)\] (.*?)\.?(?: SQLSTATE: \w+)?\s*$", text, re.M)
    return f"{found.group(1)}: {found.group(2)}" if found else None


def stopped_by_spark(word: str) -> str:
    """What stopped a run whose job Spark cancelled (``word``: ``cancelled_by_spark``'s): the
    session stopped under the run ('Job 3 cancelled because SparkContext was shut down'), or a
    cancel of the run's job, from the UI, another thread or another client."""
    if "SparkContext was shut down" in word:
        return f"its Spark session was shut down while it ran ({word})"
    return f"Spark cancelled the run's tasks ({word})"


def leftovers(joins: Collection[Join], stopped: dict[int, Stopped], gone: list[int]) -> list[str]:
    """What the run's tasks could not stop: a task that never confirmed (``gone``: the tasks
    whose host or executor was lost), and what a confirming task listed (``stopped``: by task)."""
    said = []
    for join in joins:
        confirmed = stopped.get(join.partition)
        if confirmed is None:
            why = " (its host or executor was lost)" if join.partition in gone else ""
            said.append(f"task {join.partition} on executor {join.executor} ({join.ip}) did not confirm{why}")
        else:
            said += [f"{item} (executor {confirmed.executor})" for item in confirmed.remaining]
    return said


def lost_host_deaths(plan: SparkPlan, nodes: list[str], notebook: str) -> list[RankDeath]:
    """Every rank of each host (by mpirun's name for it, the plan's token) that mpirun lost;
    ``notebook`` is the address its ranks report to (host:port)."""
    ranks = mpi_ranks(plan)
    deaths = []
    for host in (h for h in plan.hosts if h.token in nodes):
        lost = ranks[host.token]
        listed = f"rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))}"
        what = (
            f"was lost with its host {host.ip} (executor {host.executor}, {listed}): mpirun lost "
            "contact with its daemon there: the machine, its executor or its network went down (it "
            f"must reach the other hosts and the notebook at {notebook})"
        )
        deaths += [
            RankDeath(rank, what, host_lost=True, failure=FailureClass.LOST) for rank in ranks[host.token]
        ]
    return deaths


def task_death(rank: int, exit: LauncherExit) -> RankDeath:
    """A rank whose task saw its process end badly, as the task described it on its host."""
    if exit.what and exit.failure in FailureClass.__members__:
        return RankDeath(rank, exit.what, failure=FailureClass[exit.failure])
    return death_of(rank, exit.code)  # hostless: the diagnosis takes the rank's own name


def spark_failure(text: str) -> str:
    """The line of a failed job's (long, Java) error that says why: our own task's error, a lost
    executor, the exception a task's Python raised, else the stage failure, else the first line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]

    def from_marker(*markers: str) -> str | None:
        for marker in markers:
            found = next((line for line in lines if marker in line), None)
            if found is not None:
                return found[found.index(marker) :][:500]
        return None

    raised = _python_exception(lines)
    said = from_marker("hvd_magic:", "hvd_magic data:", "ExecutorLostFailure")
    said = said or (f"a task raised {raised}"[:500] if raised else None)
    return (
        said
        or from_marker("Job aborted due to stage failure")
        or (lines[0][:500] if lines else "the Spark job failed")
    )


def _python_exception(lines: list[str]) -> str:
    """The exception line (its type and message) of the first Python traceback in a Java error:
    the traceback's last line before the Java stack that follows it (and Spark's SQLSTATE)."""
    for at, line in enumerate(lines):
        if "PythonException" in line and "Traceback (most recent call last)" in line:
            body = itertools.takewhile(lambda line: not line.startswith("at "), lines[at + 1 :])
            said = [line for line in body if not line.startswith("SQLSTATE:")]
            return said[-1] if said else ""
    return ""
