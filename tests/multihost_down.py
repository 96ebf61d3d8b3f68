"""Taking the multi-host bed down (see ``tests.multihost_hosts``): every process that carries the
bed's marker or lives in one of its namespaces is killed, its links, mounts and directory removed,
and what is left (nothing) said."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import psutil

from .multihost_hosts import BED_DIR, MARKER, STOP_SECONDS, Bed, namespaces_of
from .multihost_net import links, remove_links


def bed_processes(bed: Bed | None = None) -> list[psutil.Process]:
    """Every process that carries the marker or lives in one of the bed's namespaces."""
    spaces = {space for host in (bed.hosts if bed else []) for space in host.namespaces.values()}
    found = []
    for process in psutil.process_iter():
        try:
            marked = MARKER in process.environ()
        except psutil.Error:  # gone, or a zombie: nothing of it runs
            continue
        if marked or set(namespaces_of(process.pid).values()) & spaces:
            found.append(process)
    return found


def describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid}: {' '.join(process.cmdline())[:150]}"
    except psutil.Error:  # gone since it was listed
        return f"{process.pid}: (gone)"


def _kill(processes: list[psutil.Process], inits: set[int]) -> None:
    """SIGTERM to all but the inits, SIGKILL to what is left after STOP_SECONDS, then the inits."""
    for group in ([p for p in processes if p.pid not in inits], [p for p in processes if p.pid in inits]):
        for process in group:
            try:
                process.send_signal(signal.SIGKILL if process.pid in inits else signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(group, timeout=STOP_SECONDS)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=STOP_SECONDS)


def leftovers(bed: Bed | None = None) -> list[str]:
    """What of the bed is still on the machine: processes, links, mounts, its directory."""
    found = [f"process {describe(p)}" for p in bed_processes(bed)]
    found += [f"link {name}" for name in links()]
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    found += [f"mount {line}" for line in mounts if str(BED_DIR) in line]
    return found + ([f"directory {BED_DIR}"] if BED_DIR.exists() else [])


def down_hosts(bed: Bed | None = None) -> list[str]:
    """Kill every process of the bed, remove its links and directory; what is left (nothing)."""
    bed = bed or Bed.load()
    inits = {host.pid for host in bed.hosts} if bed else set()
    for _ in range(3):  # a process that forked while the others were stopped
        processes = bed_processes(bed)
        if not processes:
            break
        _kill(processes, inits)
    for child in bed.children if bed else []:
        child.wait(timeout=STOP_SECONDS)
    remove_links()
    shutil.rmtree(BED_DIR, ignore_errors=True)
    deadline = time.monotonic() + STOP_SECONDS  # a namespace's devices go shortly after it
    while (left := leftovers(bed)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
