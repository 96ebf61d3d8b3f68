"""The plan the driver hands every barrier task: pure, from the tasks' ``Join`` records."""

from __future__ import annotations

import collections

from ..protocol import Join, PlanHost, SparkPlan
from .gloo import gloo_slots

__all__ = ["make_plan"]


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
