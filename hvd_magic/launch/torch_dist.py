"""torch.distributed ranks (``backend=torch``): the environment ``init_process_group`` reads
with its default ``env://`` rendezvous, as torchrun sets it. Nothing of ours listens: rank 0's
own TCPStore (torch's) serves the rendezvous on MASTER_ADDR:MASTER_PORT, a port chosen free on
rank 0's host. Like MPI's and Gloo's traffic between ranks, that store is not authenticated:
run on a network you trust (locally it binds loopback)."""

from __future__ import annotations

import socket

from hvd_magic.protocol import GlooSlot

__all__ = ["free_port", "torch_env"]


def torch_env(slot: GlooSlot, master_addr: str, master_port: int) -> dict[str, str]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT`` for one rank (the layout is Horovod's: hosts in order)."""
    return {
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(slot.size),
        "LOCAL_RANK": str(slot.local_rank),
        "LOCAL_WORLD_SIZE": str(slot.local_size),
        "GROUP_RANK": str(slot.cross_rank),
        "GROUP_WORLD_SIZE": str(slot.cross_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (rank 0's store binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
