"""A real multi-host cluster on one machine, for tests: hosts with their own address, disk and name.

Four hosts, each a set of Linux namespaces (``tests.multihost_hosts``; root needed) on a bridge
of their own (``tests.multihost_net``): hostA runs the Spark standalone master, hostA, hostB and
hostC one worker each (``cores`` slots, 1 by default), and hostD the notebook's kernel, which
is Spark's driver (``tests.multihost_spark``). Tests drive the kernel by executing cells, as a
notebook does (``tests.kernels.Kernel``). ``tests.multihost_faults`` kills a host, cuts its link
and lists what a run left on a host.

In tests, the ``multihost`` fixture (module scope; ``tests/conftest.py`` makes it available):
a ``Cluster`` whose kernel already holds ``spark``, a session with all workers' executors. The
tests are marked ``multihost`` (``pytest -m multihost`` runs just them).

For humans::

    python -m tests.multihost up        # the hosts, the master and the workers; stays up
    python -m tests.multihost status
    python -m tests.multihost run hostB ip -o addr
    python -m tests.multihost down      # everything, then checks that nothing is left

A bed brought up this way is reused by the fixture (which then leaves it up).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .kernels import Kernel
from .multihost_down import down_hosts
from .multihost_hosts import BED_DIR, Bed, unusable_reason, up_hosts
from .multihost_net import links
from .multihost_spark import (
    alive_workers,
    start_kernel,
    start_session,
    start_spark,
    stop_kernel,
    wait_for_workers,
)

HOSTS = ["hostA", "hostB", "hostC", "hostD"]
WORKERS = ["hostA", "hostB", "hostC"]
MASTER, DRIVER = "hostA", "hostD"
LOCK = Path("/run/lock/hvd_magic-bed.lock")  # one bed per machine: its names and bridge are fixed
LOCK_SECONDS = 600.0


@dataclass
class Cluster:
    bed: Bed
    master_url: str
    log_dir: Path
    kernel: Kernel | None = None  # on DRIVER, with `spark`

    def ip(self, host: str) -> str:
        return self.bed.host(host).ip


@functools.cache
def skip_reason() -> str | None:
    """Probed once per session: why the bed cannot run here, or None."""
    return unusable_reason()


def start_cluster(log_dir: Path, cores: int = 1) -> Cluster:
    """The hosts, the master and the workers (not waited for: the kernel starts meanwhile)."""
    if Bed.load() is not None or links():  # a bed that died half-way: clear it first
        down_hosts()
    bed = up_hosts(HOSTS)
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        return Cluster(bed, start_spark(bed, MASTER, WORKERS, cores, log_dir), log_dir)
    except BaseException:
        down_hosts(bed)
        raise


def stop_cluster(cluster: Cluster | None = None) -> list[str]:
    """Everything of the bed gone; what could not be removed (nothing, normally)."""
    return down_hosts(cluster.bed if cluster else None)


@contextlib.contextmanager
def bed_lock(wait: float = LOCK_SECONDS) -> Iterator[bool]:
    """Whether this process holds the bed (another test session or ``up``/``down`` may, for a
    while: waited for up to ``wait`` seconds)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as handle:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.5)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def running_cluster(log_dir: Path, cores: int = 1) -> Iterator[Cluster]:
    """The bed brought up by ``python -m tests.multihost up`` if there is one (left up), else
    a new one, torn down after with nothing left. The caller holds ``bed_lock``."""
    bed = Bed.load()
    if bed is not None and bed.alive():
        yield Cluster(bed, f"spark://{bed.host(MASTER).ip}:7077", BED_DIR / "logs")
        return
    started = time.monotonic()
    cluster = start_cluster(log_dir, cores)
    try:
        yield cluster
    finally:
        began = time.monotonic()
        left = stop_cluster(cluster)
        print(f"multihost: up for {began - started:.1f} s, teardown {time.monotonic() - began:.1f} s")
        assert left == [], f"the multi-host bed left things behind: {left}"


@contextlib.contextmanager
def notebook(cluster: Cluster, cores: int = 1) -> Iterator[Kernel]:
    """The notebook's kernel on DRIVER, holding ``spark`` (every worker's executor registered)."""
    kernel, process = start_kernel(cluster.bed, DRIVER, cluster.log_dir)
    try:
        start_session(kernel, cluster.bed, cluster.master_url, DRIVER, len(WORKERS) * cores, cores)
        wait_for_workers(cluster.ip(MASTER), len(WORKERS), cluster.log_dir)
        yield kernel
    finally:
        stop_kernel(kernel, process)


@pytest.fixture(scope="module")
def multihost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The multi-host bed with a notebook kernel on hostD (skipped where it cannot run)."""
    if reason := skip_reason():
        pytest.skip(reason)
    log_dir = tmp_path_factory.mktemp("multihost")
    with bed_lock() as held:
        if not held:
            pytest.skip(f"the multi-host bed stayed in use by another process for {LOCK_SECONDS:.0f} s")
        with running_cluster(log_dir) as cluster, notebook(cluster) as kernel:
            cluster.kernel = kernel
            yield cluster


def _up() -> int:
    if reason := skip_reason():
        print(f"cannot start the bed: {reason}", file=sys.stderr)
        return 1
    started = time.monotonic()
    with bed_lock(wait=0) as held:
        bed = Bed.load()
        if not held or (bed is not None and bed.alive()):
            print("a bed is up, or in use by a test session: see status", file=sys.stderr)
            return 1
        cluster = start_cluster(BED_DIR / "logs")
    wait_for_workers(cluster.ip(MASTER), len(WORKERS), cluster.log_dir)
    print(f"the bed is up ({time.monotonic() - started:.1f} s); master {cluster.master_url}")
    return _status()


def _status() -> int:
    bed = Bed.load()
    if bed is None:
        print("no bed is up")
        return 1
    print(f"bed {bed.id} on {bed.subnet}: {'running' if bed.alive() else 'DEAD (run down)'}")
    for host in bed.hosts:
        print(f"  {host.name:6} {host.ip:15} init pid {host.pid}")
    print(f"  Spark workers alive: {alive_workers(bed.host(MASTER).ip)}; logs in {BED_DIR / 'logs'}")
    return 0


def _down() -> int:
    started = time.monotonic()
    with bed_lock(wait=60) as held:
        if not held:
            print("the bed is in use by a test session (60 s): try again later", file=sys.stderr)
            return 1
        left = stop_cluster()
    print(f"down in {time.monotonic() - started:.1f} s; left behind: {left or 'nothing'}")
    return 1 if left else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.multihost", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["up", "status", "down", "run"])
    parser.add_argument("host", nargs="?", help="run: the host (hostA..hostD)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="run: the command")
    args = parser.parse_args(argv)
    if args.action == "run":
        bed = Bed.load()
        if bed is None or not args.host or not args.command:
            parser.error("run needs a bed that is up, a host and a command")
        return subprocess.run(bed.command(args.host, args.command), check=False).returncode
    return {"up": _up, "status": _status, "down": _down}[args.action]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
