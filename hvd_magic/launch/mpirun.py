"""Open MPI's ``mpirun``: the command line we give it, and what its report says about a death."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hvd_magic.launch.processes import RankDeath, death_of

if TYPE_CHECKING:
    from hvd_magic.launch.memory_cgroup import MemoryWatch

__all__ = ["idle_wait_env", "lost_node", "mpirun_argv", "mpirun_deaths", "tcp_interface_env"]

TCP_INTERFACE_VARIABLE = "OMPI_MCA_btl_tcp_if_include"
YIELD_VARIABLE = "OMPI_MCA_mpi_yield_when_idle"


def mpirun_argv(
    np: int,
    command: list[str],
    *,
    as_root: bool = False,
    hosts: list[tuple[str, int]] | None = None,
    rsh_agent: str | None = None,
    export_env: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """The mpirun command line for ``np`` ranks of ``command``.

    Not horovodrun's flags: its ``-mca btl ^openib`` re-enables the ofi BTL (+1 s at shutdown
    here); ``pml ob1`` skips probing for psm/psm2 fabrics.
    """
    argv = ["mpirun"]
    if as_root:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(np), "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1"]
    # mpirun maps its hwloc topology into shared memory at an address it guesses from its own
    # memory map; under Spark that guess sometimes lands on a mapped page and mpirun segfaults
    # (hwloc_shmem_topology_write). Ranks do not need the shared copy.
    argv += ["--mca", "rtc_hwloc_vmhole", "none"]
    if hosts:
        argv += ["-H", ",".join(f"{host}:{slots}" for host, slots in hosts)]
        argv += ["--mca", "btl", "self,vader,tcp"]
    else:
        argv += ["--oversubscribe", "--mca", "btl", "self,vader"]
    if rsh_agent:
        argv += ["--mca", "plm_rsh_agent", rsh_agent]
    for name in export_env:
        argv += ["-x", name]
    return argv + command


def tcp_interface_env(interface: str, env: Mapping[str, str]) -> dict[str, str]:
    """The environment that keeps one host's ranks' MPI traffic on ``interface`` (the one that
    carries the host's address, as Horovod's Gloo already is), for that host's orted to pass on.

    Left to itself Open MPI's TCP transport spreads its connections over every interface of a
    host, and one that goes away mid-run (a container bridge, a VPN) then hangs the ranks in
    their next collective: nothing resets a connection to an address that is no longer there.
    By name, host by host (names differ between hosts): Open MPI 4.1's ``a.b.c.d/32`` form hung
    ``MPI_Init`` here once the machine had a bridge with an address. Nothing where the interface
    is unknown or the run's environment chose one itself.
    """
    if not interface or TCP_INTERFACE_VARIABLE in env:
        return {}
    return {TCP_INTERFACE_VARIABLE: interface}


def idle_wait_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment in which ranks waiting in MPI give up the core between polls, for mpirun
    to pass on to its daemons and ranks; nothing where the run's environment chose.

    Open MPI spins at full speed in a wait unless it counts more ranks on a host than the host
    has slots; a Spark host offers one slot per task, so it spins there. But Horovod calls MPI
    from its background thread only, while the rank's own threads (its framework's share of the
    host's cores) compute on those same cores: a spinning wait takes the core from the rank it
    waits for. Three idle ranks on a two-executor local-cluster here took 18 CPU-s in 10 s
    spinning, 4.5 yielding (``bench/idle_ranks.py --spark``); a wait that yields costs a system
    call per poll where no other thread wants the core.
    """
    return {} if YIELD_VARIABLE in env else {YIELD_VARIABLE: "1"}


_MPIRUN_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on\s+node (\S+) exited on signal (\d+)")
_MPIRUN_IMPROPER = re.compile(r"process rank (\d+) with PID \d+ on\s+node (\S+) exiting improperly")
_MPIRUN_CODE = re.compile(
    r"The first process to do so was:\s+Process name:\s+\[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)"
)


# Open MPI 4's report when it loses a daemon ("Remote daemon: [[1,0],3] on node hvd-host-2"), and
# our rsh client's when the exec agent it relays to goes quiet (``agent._relay``).
_LOST_NODE = re.compile(r"Remote daemon\s*:\s*\S+ on node (\S+)|hvd_magic: the exec agent on (\S+) at ")


def lost_node(line: str) -> str | None:
    """The host (mpirun's name for it) that a line of mpirun's output says was lost, or None."""
    found = _LOST_NODE.search(line)
    return (found[1] or found[2]) if found else None


def mpirun_deaths(output: str, memory: MemoryWatch | None = None) -> list[RankDeath]:
    """The rank mpirun saw end first, from its own report (Open MPI 4); [] if it reported none.
    ``memory``: the memory cgroup the ranks share with mpirun (on this host), if known."""
    if found := _MPIRUN_SIGNAL.search(output):
        return [death_of(int(found[1]), -int(found[3]), found[2], memory)]
    if found := _MPIRUN_IMPROPER.search(output):
        what = "exited without shutting down (os._exit, or a crash outside Python)"
        return [RankDeath(int(found[1]), what, found[2])]
    if found := _MPIRUN_CODE.search(output):
        return [death_of(int(found[1]), int(found[2]))]
    return []
