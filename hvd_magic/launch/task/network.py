"""A Spark task's view of the network: its own address, the interface that carries it, and
whether the notebook's hub can be reached from here."""

from __future__ import annotations

import os
import socket

import psutil

__all__ = ["check_reachable", "interface_of", "own_address"]

REACH_SECONDS = 10.0


def own_address(toward: str) -> str:
    """This executor's address: SPARK_LOCAL_IP if set, else the one that routes to the driver."""
    if os.environ.get("SPARK_LOCAL_IP"):
        return os.environ["SPARK_LOCAL_IP"]
    host = toward.split("//")[-1].rsplit(":", 1)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return str(probe.getsockname()[0])


def interface_of(address: str) -> str:
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return str(name)
    return "lo" if address.startswith("127.") else ""


def check_reachable(address: str, timeout: float = REACH_SECONDS) -> None:
    """Fail the task at once, saying where it tried, when the notebook's hub cannot be reached
    from this executor (a firewall, or the notebook's address as seen from the cluster)."""
    host, port = address.split("//")[-1].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise ConnectionError(
            f"hvd_magic: this executor cannot reach the notebook at {host}:{port} ({err}). In the notebook, "
            "set os.environ['HVD_MAGIC_DRIVER_HOST'] to an address of its machine that the executors "
            "reach (and let them connect to it), then run the cell again."
        ) from None
