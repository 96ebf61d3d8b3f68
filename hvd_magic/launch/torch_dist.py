"""torch.distributed ranks (``backend=torch``): the environment ``init_process_group`` reads
with its default ``env://`` rendezvous, as torchrun sets it. Nothing of ours listens: rank 0's
own TCPStore (torch's) serves the rendezvous on MASTER_ADDR:MASTER_PORT, a port of rank 0's host
held for it (``reserve_port``) until the run ends. Like MPI's and Gloo's traffic between ranks,
that store is not authenticated: run on a network you trust (locally it binds loopback)."""

from __future__ import annotations

import socket

from hvd_magic.protocol import GlooSlot

__all__ = ["reserve_port", "torch_env"]


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


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """A port of ``host`` held for rank 0's store: bound with SO_REUSEADDR and never listening,
    so that the kernel gives it to no other socket (another process's ``bind(0)`` or outgoing
    connection), while torch's store, which binds with SO_REUSEADDR too, can listen on it. A
    port merely found free could be taken before rank 0 starts (EADDRINUSE in
    ``init_process_group``: seen once, in a run that lost a host and grew back). Close it once
    the ranks are gone."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind((host, 0))
    return holder
