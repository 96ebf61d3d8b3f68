"""Faults on the multi-host bed (``tests.multihost``): a host killed, a host's link cut; and what a
run may leave on a host (its processes, Open MPI's session and shared-memory directories)."""

from __future__ import annotations

import glob
import os
import signal
import time
from typing import TYPE_CHECKING

import psutil

from .helpers import is_run_process
from .multihost_down import bed_processes, describe
from .multihost_hosts import Bed, namespaces_of
from .multihost_net import LINK_PREFIX, sh
from .multihost_spark import EXECUTORS_CELL, START_SECONDS, start_worker

if TYPE_CHECKING:
    from .multihost import Cluster

# What a run writes under a host's /tmp outside the user's code: Open MPI's directories (ours,
# its own default ones, our staging name); Horovod's timeline is the user's and the worker's.
RUN_FILES = "/tmp/hvd_magic-shm-* /tmp/.hvd_magic-new-* /tmp/ompi.* /tmp/hvd_magic-timeline-*"


def host_processes(bed: Bed, name: str) -> list[psutil.Process]:
    """Every process in host ``name``'s namespaces but its init (which holds them)."""
    host = bed.host(name)
    return [p for p in bed_processes(bed) if p.pid != host.pid and namespaces_of(p.pid) == host.namespaces]


def kill_host(bed: Bed, name: str) -> list[str]:
    """SIGKILL every process of the host at once, as a machine that dies; what was killed.
    All are stopped first: killed one by one, one could see another die and act on it (the
    scratch directory's watcher removes the directory once its owner is gone)."""
    victims = host_processes(bed, name)
    killed = [describe(p) for p in victims]
    for signal_number in (signal.SIGSTOP, signal.SIGKILL):
        for process in victims:
            try:
                process.send_signal(signal_number)
            except psutil.NoSuchProcess:
                pass
    _, alive = psutil.wait_procs(victims, timeout=15)
    assert not alive, f"still alive on {name}: {[describe(p) for p in alive]}"
    return killed


def set_link(name: str, up: bool) -> None:
    """The machine's end of host ``name``'s veth pair, up or down (down: the host is cut off)."""
    sh("ip", "link", "set", f"{LINK_PREFIX}{name}", "up" if up else "down")


def run_processes(bed: Bed) -> list[str]:
    """Processes of a run (ranks and their stand-ins, agents' clients, orted, mpirun) still alive
    on any host; not the fork servers Spark's Python workers keep for the next run."""
    found = []
    for process in bed_processes(bed):
        try:
            if is_run_process(process.cmdline()):
                found.append(describe(process))
        except psutil.Error:
            continue
    return found


def files_left(bed: Bed, hosts: list[str]) -> dict[str, list[str]]:
    """Each host's run directories and files still under /tmp (only hosts that have some)."""
    left = {}
    for name in hosts:
        root = bed.seen_from(name, "")
        listed = sorted(path.removeprefix(root) for p in RUN_FILES.split() for path in glob.glob(root + p))
        if listed:
            left[name] = listed
    return left


def wait_for_file(bed: Bed, hosts: list[str], path: str, timeout: float) -> str:
    """The first of ``hosts`` on which ``path`` exists, waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in hosts:
            if os.path.lexists(bed.seen_from(name, path)):
                return name
        time.sleep(0.2)
    raise TimeoutError(f"{path} did not appear on any of {hosts} within {timeout:.0f} s")


def wait_until_clean(bed: Bed, hosts: list[str], timeout: float) -> dict[str, list[str]]:
    """Until no host of ``hosts`` has a run's directories or files left (bounded); those left."""
    deadline = time.monotonic() + timeout
    while (left := files_left(bed, hosts)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def wait_until_gone(bed: Bed, timeout: float = 30) -> list[str]:
    """Until no run process is left on any host (bounded); those still there."""
    deadline = time.monotonic() + timeout
    while (left := run_processes(bed)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def restart_worker(cluster: Cluster, name: str, executors: int) -> None:
    """Host ``name``'s Spark worker again, and the kernel's ``spark`` back to ``executors``."""
    assert cluster.kernel is not None
    start_worker(cluster.bed, name, cluster.master_url, 1, cluster.log_dir)
    ready = cluster.kernel.run(EXECUTORS_CELL.format(count=executors, timeout=START_SECONDS), timeout=120)
    assert ready.status == "ok", f"{ready.ename}: {ready.evalue}"
