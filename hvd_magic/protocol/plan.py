"""The Spark plan: which task runs where, as the driver hands it to every barrier task."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GlooSlot", "PlanHost", "SparkPlan", "gpu_for_local_rank"]


@dataclass(frozen=True)
class GlooSlot:
    """One rank's place in Horovod's layout (what horovodrun --gloo hands each rank), and its
    host's among the hosts (torchrun's ``GROUP_RANK``)."""

    hostname: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int  # among the hosts that have a rank of this local rank (Horovod's cross_<local_rank>)
    cross_size: int
    group_rank: int = 0  # its host's place among the hosts
    group_size: int = 1

    def env(self) -> dict[str, str]:
        """``HOROVOD_RANK``, ``HOROVOD_HOSTNAME``, ...: the rank's Gloo environment."""
        horovod = ("hostname", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
        return {f"HOROVOD_{key.upper()}": str(getattr(self, key)) for key in horovod}


@dataclass(frozen=True)
class PlanHost:
    """One executor as a "host" of the job: its tasks (partitions) and their GPUs, in order."""

    token: str  # the host name mpirun and Horovod see: hvd-host-0, hvd-host-1, ...
    executor: str
    ip: str
    partitions: list[int]
    gpus: list[list[str]]  # per task of this host, in partition order
    agent: str = ""  # the exec agent's address (mpi)
    shards: list[str] = field(default_factory=list)  # data=: per task of this host, its shard file


@dataclass(frozen=True)
class SparkPlan:
    """Hosts in rank order; mpirun runs in ``mpirun_partition``'s task; ``slots`` (Gloo and
    torch) maps each partition to its rank's slot."""

    hosts: list[PlanHost]
    mpirun_partition: int
    slots: dict[int, GlooSlot] = field(default_factory=dict)
    master_port: int = 0  # backend=torch: rank 0's store, on the first host's address

    def host_of(self, partition: int) -> PlanHost:
        return next(host for host in self.hosts if partition in host.partitions)

    def to_json(self) -> dict[str, Any]:
        return {
            "hosts": [dataclasses.asdict(host) for host in self.hosts],
            "mpirun_partition": self.mpirun_partition,
            "slots": {str(p): dataclasses.asdict(slot) for p, slot in self.slots.items()},
            "master_port": self.master_port,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SparkPlan:
        return cls(
            hosts=[PlanHost(**host) for host in data["hosts"]],
            mpirun_partition=int(data["mpirun_partition"]),
            slots={int(p): GlooSlot(**slot) for p, slot in data.get("slots", {}).items()},
            master_port=int(data.get("master_port", 0)),
        )


def gpu_for_local_rank(slot_gpus: str | None, local_rank: int, by_local_rank: bool = False) -> str | None:
    """CUDA_VISIBLE_DEVICES for this rank: the GPUs Spark gave the slot of ``local_rank``.

    ``by_local_rank`` (torch.distributed ranks, whose code picks ``cuda:LOCAL_RANK``, as under
    torchrun) with one GPU a slot, each its own: every slot's GPU on the host, in local-rank
    order, so that device ``LOCAL_RANK`` is the rank's own. Slots that share a GPU (Spark's
    ``spark.task.resource.gpu.amount=0.5``) see theirs once: a device listed twice hides every
    device from CUDA."""
    if not slot_gpus:
        return None
    slots = json.loads(slot_gpus)
    if local_rank >= len(slots) or not slots[local_rank]:
        return None
    if (
        by_local_rank
        and all(len(slot) == 1 for slot in slots)
        and len({slot[0] for slot in slots}) == len(slots)
    ):
        return ",".join(str(slot[0]) for slot in slots)
    return ",".join(dict.fromkeys(str(gpu) for gpu in slots[local_rank]))
