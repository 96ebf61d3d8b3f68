"""torch.distributed ranks (``backend=torch``): the environment ``init_process_group`` reads
with its default ``env://`` rendezvous, as torchrun sets it. Nothing of ours listens: rank 0's
own TCPStore (torch's) serves the rendezvous on MASTER_ADDR:MASTER_PORT, a port of rank 0's host
held for it (``reserve_port``) until the run ends. Like MPI's and Gloo's traffic between ranks,
that store is not authenticated, and torch binds it on every interface (MASTER_ADDR is only where
the ranks reach it; locally, loopback): run on a network you trust."""

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
        "GROUP_RANK": str(slot.group_rank),
        "GROUP_WORLD_SIZE": str(slot.group_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def reserve_port() -> socket.socket:
    """A port held for rank 0's store: bound on every address (as torch's store binds) with
    SO_REUSEADDR and never listening. The kernel then hands it to no ``bind(0)`` and no outgoing
    connection, on any address, while the store, which binds with SO_REUSEADDR too, can listen
    on it. (A socket that binds that very port with SO_REUSEADDR could still take it: nothing
    here picks ports that way.) A port merely found free could be taken before rank 0 starts:
    EADDRINUSE in ``init_process_group``, seen once in a run that lost a host and grew back.
    Close it once the ranks are gone."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("", 0))
    return holder
