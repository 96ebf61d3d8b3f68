"""What each Spark barrier task runs on its executor (imported there by reference).

With ``data=``, the stage's input is the keyed DataFrame (``data.source``): each task first
writes its partition, which is exactly one shard, to a file on its executor. Every task then
reports itself to the notebook's hub (``Join``: executor, address, GPUs, agent address, shard)
and gets the run's ``Plan`` back: one rendezvous through the driver, not Spark's
``allGather`` (~1 s per call here). With MPI, the first task runs mpirun, and the first task of
each executor serves the exec agent that starts that executor's share of the ranks. With Gloo,
each task starts its own rank and serves it the rendezvous store on loopback, relaying to the
driver's store. Every task holds its slot (and GPU) until the driver releases it. Warm ranks
(``TaskSpec.warm``) are forked from a server the executor's Python workers share, which lasts as
long as the executor (``warm.servers``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from hvd_magic.data.parquet import Piece, write_manifest
from hvd_magic.hub import RunKeys
from hvd_magic.launch import processes
from hvd_magic.launch.gloo import LoopbackStoreServer, gloo_env
from hvd_magic.launch.mpirun import idle_wait_env, mpirun_argv, tcp_interface_env
from hvd_magic.launch.task.agent import ExecAgent, open_mpi_dirs
from hvd_magic.launch.task.network import check_reachable, interface_of, own_address
from hvd_magic.launch.task.slot import hold_slot, say
from hvd_magic.launch.torch_dist import reserve_port, torch_env
from hvd_magic.protocol import (
    Abort,
    Join,
    Plan,
    Release,
    SparkPlan,
    Stopped,
    StoreAnswer,
    StoreRequest,
)
from hvd_magic.protocol.env import (
    ENV_AGENT_TOKEN,
    ENV_AGENTS,
    ENV_FORK_SERVER,
    ENV_SHARDS,
    ENV_SLOT_GPUS,
    worker_command,
)
from hvd_magic.protocol.plan import gpu_for_local_rank
from hvd_magic.rank.hub_client import HubClient
from hvd_magic.warm import servers

__all__ = ["STAGE_SCHEMA", "TaskSpec", "barrier_stage", "barrier_task"]
PLAN_TIMEOUT = 120.0
STORE_TIMEOUT = 30.0


@dataclass
class TaskSpec:
    np: int
    launcher: str
    env: dict[str, str]
    hub_address: str
    hub_token: str
    agent_keys: RunKeys
    task_cpus: int
    run_id: str = "run"
    shard_sizes: list[int] = field(default_factory=list)  # data=: rows each partition must hold
    pieces: list[list[Piece]] = field(default_factory=list)  # data= Parquet: what each task reads
    warm: tuple[str, ...] = ()  # what this worker's fork server preloads for warm ranks (warm.choice)


STAGE_SCHEMA = "code long"  # what each task of the barrier stage returns: its exit code


def barrier_stage(spec: TaskSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """The function of the barrier stage (``mapInArrow(..., barrier=True)``)."""
    import pyarrow as pa

    code = barrier_task(spec, batches)
    for _ in batches:  # read to its end: Spark reuses a Python worker only if it read its input
        pass
    yield pa.RecordBatch.from_pydict({"code": [code]})


def executor_id(address: str) -> str:
    """This task's executor as Spark's scheduler names it (its JVM's ``--executor-id``: what a
    decommission is told by); the task's address where there is none (local mode)."""
    for process in psutil.Process().parents():
        with contextlib.suppress(psutil.Error):
            argv = process.cmdline()
            if "--executor-id" in argv[:-1]:
                return str(argv[argv.index("--executor-id") + 1])
    return address


def barrier_task(spec: TaskSpec, batches: Iterator[Any]) -> int:
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    partition = context.partitionId()
    address = context.getTaskInfos()[partition].address
    shard = _write_shard(spec, partition, address, batches) if spec.shard_sizes else ""
    try:
        return _run_task(spec, context, partition, executor_id(address), shard)
    finally:
        if shard:
            os.unlink(shard)


def _write_shard(spec: TaskSpec, partition: int, address: str, batches: Iterator[Any]) -> str:
    """This partition (exactly one shard) into a file on this executor, for the rank here."""
    from hvd_magic.data.files import scratch_dir, write_shard
    from hvd_magic.data.source import KEY

    path = os.path.join(scratch_dir(), f"hvd_magic-{spec.run_id}-shard-{partition}.arrow")
    metadata = {"partition": str(partition), "executor": address, "pid": str(os.getpid())}
    if spec.pieces:  # a plain Parquet scan: the rank reads its rows from the files
        return write_manifest(path, spec.pieces[partition], metadata)
    first = next(batches, None)
    rows = 0
    if first is not None:
        columns = [name for name in first.schema.names if name != KEY]
        head = first.select(columns)
        rest = (batch.select(columns) for batch in batches)
        rows = write_shard(path, itertools.chain([head], rest), head.schema, metadata)
    if rows != spec.shard_sizes[partition]:
        if rows:
            os.unlink(path)
        raise RuntimeError(
            f"hvd_magic data: shard {partition} holds {rows} rows, not the {spec.shard_sizes[partition]} "
            "counted: the DataFrame is not deterministic (it samples, or its source changed). "
            "Materialize it first, e.g. df = df.localCheckpoint()."
        )
    return path


def _run_task(spec: TaskSpec, context: Any, partition: int, executor: str, shard: str) -> int:
    check_reachable(spec.hub_address)
    # Before joining: mpirun may start this host's ranks as soon as every task has its plan.
    # kept by this Python worker's parent (the executor's Python daemon, or its JVM without one),
    # which Spark keeps as long as the executor: not by this worker, which it may end
    server = servers.serving(spec.warm, spec.env, keeper=os.getppid()) if spec.warm else None
    resources = context.resources()
    client = HubClient(spec.hub_address, spec.hub_token, rank=-1)
    ip = own_address(spec.hub_address)
    agent_say = functools.partial(say, client)
    agent = ExecAgent(ip, spec.agent_keys, "", {}, agent_say) if spec.launcher == "mpi" else None
    held = reserve_port() if spec.launcher == "torch" else None  # for rank 0's store, if rank 0 is ours
    join = Join(
        partition=partition,
        executor=executor,
        ip=ip,
        gpus=list(resources["gpu"].addresses) if "gpu" in resources else [],
        python=sys.executable,
        agent=agent.address if agent is not None else "",
        shard=shard,
        port=held.getsockname()[1] if held is not None else 0,
    )
    client.send(join)
    code = 1
    try:
        answer = client.receive(PLAN_TIMEOUT)
        if answer is not None and isinstance(answer.record, (Abort, Release)):
            code = 0  # the run was stopped before it launched anything
        elif answer is None or not isinstance(answer.record, Plan):
            raise RuntimeError(
                f"task {partition}: no launch plan from the notebook within {PLAN_TIMEOUT:.0f} s"
            )
        elif agent is not None:
            code = _mpi_task(spec, answer.record.plan, partition, agent, client, server)
        elif spec.launcher == "torch":
            code = _torch_task(spec, answer.record.plan, partition, client, servers.rank_command(server))
        else:
            code = _gloo_task(spec, answer.record.plan, partition, client, servers.rank_command(server))
    finally:
        if held is not None:  # the ranks' store has bound it by now, or will not
            held.close()
        if agent is not None:
            agent.close()
        # The driver returns from its stop only once every task confirmed this.
        remaining = processes.stop_and_confirm(servers.own_processes())
        client.send(Stopped(join.executor, [processes.describe(p) for p in remaining]))
        client.close()
    return code


def _mpi_task(
    spec: TaskSpec, plan: SparkPlan, partition: int, agent: ExecAgent, client: HubClient, server: str | None
) -> int:
    host = plan.host_of(partition)
    if host.partitions[0] == partition:  # (mpirun may reach the agent first: its Exec waits)
        local_ranks = len(host.partitions)
        env = {ENV_SLOT_GPUS: json.dumps(host.gpus), ENV_SHARDS: json.dumps(host.shards)}
        env |= processes.thread_budget_env(local_ranks, local_ranks * spec.task_cpus, spec.env)
        env |= tcp_interface_env(interface_of(host.ip), os.environ | spec.env)
        if server:  # this host's ranks are forked from this task's server
            env[ENV_FORK_SERVER] = server
        agent.place(host.token, env)
    process = _start_mpirun(spec, plan, agent) if partition == plan.mpirun_partition else None
    return hold_slot(client, process)


def _start_mpirun(spec: TaskSpec, plan: SparkPlan, agent: ExecAgent) -> subprocess.Popen[bytes]:
    """mpirun, its session directory in this executor's scratch (see ``ExecAgent.scratch``).
    Where every rank is on this task's host, mpirun starts them itself, as on the notebook's
    machine: no agent, no orted on the cell's path."""
    alone = len(plan.hosts) == 1
    argv = mpirun_argv(
        spec.np,
        servers.stand_in() if spec.warm else worker_command(),
        as_root=os.geteuid() == 0,
        hosts=None if alone else [(host.token, len(host.partitions)) for host in plan.hosts],
        rsh_agent=None if alone else f"{sys.executable} -m hvd_magic.launch.task.agent",
        export_env=sorted(spec.env),
    )
    # Its session directory under TMPDIR: mpirun hands its OMPI_MCA_* settings on to every
    # orted, which would then make theirs under this path on their own hosts, held by no one.
    own = os.path.join(agent.scratch(), "mpirun")
    os.makedirs(own, exist_ok=True)
    if alone:  # what the agent gives the ranks of its host, given by mpirun instead (no secrets)
        env = dict(os.environ) | agent.host_env | open_mpi_dirs(own) | spec.env
        return processes.spawn(argv, env | idle_wait_env(env) | {"TMPDIR": own})
    # mpirun's rsh client reaches each host's agent: their addresses, and its key to them
    agents = json.dumps({host.token: host.agent for host in plan.hosts})
    secrets = {ENV_AGENTS: agents, ENV_AGENT_TOKEN: spec.agent_keys.client_token()}
    env = dict(os.environ) | spec.env
    return processes.spawn(argv, env | idle_wait_env(env) | secrets | {"TMPDIR": own})


def _rank_env(spec: TaskSpec, plan: SparkPlan, partition: int) -> dict[str, str]:
    """The environment of the rank this task starts itself (Gloo, torch): its slot's GPUs,
    its share of the host's CPUs, its shard."""
    host = plan.host_of(partition)
    local_ranks = len(host.partitions)
    env = (
        dict(os.environ)
        | spec.env
        | processes.thread_budget_env(local_ranks, local_ranks * spec.task_cpus, spec.env)
    )
    env[ENV_SHARDS] = json.dumps(host.shards)
    local_rank = plan.slots[partition].local_rank
    by_local_rank = spec.launcher == "torch"  # torch code picks cuda:LOCAL_RANK
    gpus = gpu_for_local_rank(json.dumps(host.gpus), local_rank, by_local_rank)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def _torch_task(spec: TaskSpec, plan: SparkPlan, partition: int, client: HubClient, argv: list[str]) -> int:
    """backend=torch: this task's rank, with rank 0's store on the first host."""
    master = torch_env(plan.slots[partition], plan.hosts[0].ip, plan.master_port)
    return hold_slot(client, processes.spawn(argv, _rank_env(spec, plan, partition) | master))


def _gloo_task(spec: TaskSpec, plan: SparkPlan, partition: int, client: HubClient, command: list[str]) -> int:
    slot = plan.slots[partition]
    host = plan.host_of(partition)
    env = _rank_env(spec, plan, partition)
    relay = HubClient(spec.hub_address, spec.hub_token, rank=-1)
    store = LoopbackStoreServer(functools.partial(_ask_driver, relay))
    env |= gloo_env(slot, store.port, interface_of(host.ip))
    try:
        return hold_slot(client, processes.spawn(command, env))
    finally:
        store.close()
        relay.close()


def _ask_driver(relay: HubClient, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    """The Gloo store backend of a task: the driver's store, over the run's CURVE channel."""
    answer = relay.ask(StoreRequest(0, method, path), body, STORE_TIMEOUT)
    if not isinstance(answer.record, StoreAnswer):
        raise ValueError(f"the driver answered a store request with {answer.kind.value!r}")
    return answer.record.status, answer.blob
