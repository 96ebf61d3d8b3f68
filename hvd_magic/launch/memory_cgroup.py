"""What the kernel's memory controller records about a process we started: whether its
out-of-memory killer struck while the process ran, and the limit it enforced.

A SIGKILL alone does not say who sent it. The memory cgroup does: cgroup v1 counts its OOM kills
in ``memory.oom_control`` (``oom_kill N``), cgroup v2 in ``memory.events``. A launcher watches the
cgroup of each process it starts (and the nearest ancestor with a limit: containers often limit a
parent) when it starts, and reads the counters again when the process has died of SIGKILL.
Read on the host where the process ran: the notebook's for local ranks, the executor's for a
Spark task's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["MemoryWatch", "OomKill"]

_UNLIMITED = 1 << 60  # v1 writes 9223372036854771712 for "no limit"


@dataclass(frozen=True)
class OomKill:
    """The kernel's OOM killer struck in ``group`` (a cgroup path) while our process ran."""

    group: str
    limit: int | None  # bytes; None when the cgroup had no limit of its own

    def text(self) -> str:
        limit = f"its limit of {self.limit / 2**20:,.0f} MiB" if self.limit else "its memory"
        return f"was killed by the kernel's out-of-memory killer: the memory cgroup {self.group} hit {limit}"


@dataclass(frozen=True)
class _Counter:
    group: str  # as /proc/PID/cgroup names it
    directory: str  # where its files are
    kills: int


class MemoryWatch:
    """The OOM counters of a process's memory cgroups, as they were when it started."""

    def __init__(self, counters: list[_Counter], version: int) -> None:
        self._counters, self._version = counters, version

    @classmethod
    def of(cls, pid: int) -> MemoryWatch | None:
        """The watch of a live process, or None where its memory cgroup cannot be read (no
        memory controller, a /proc or /sys we cannot see)."""
        try:
            found = _memory_directory(pid)
            if found is None:
                return None
            group, directory, version = found
            counters = [
                _Counter(name, path, kills)
                for name, path in _watched(group, directory, version)
                if (kills := _oom_kills(path, version)) is not None
            ]
        except OSError:
            return None
        return cls(counters, version) if counters else None

    def oom_kill(self) -> OomKill | None:
        """The cgroup whose OOM killer struck since the watch began, or None."""
        for counter in self._counters:
            try:
                kills = _oom_kills(counter.directory, self._version)
            except OSError:
                continue
            if kills is not None and kills > counter.kills:
                return OomKill(counter.group, _limit(counter.directory, self._version))
        return None


def _memory_directory(pid: int) -> tuple[str, str, int] | None:
    """The process's memory cgroup: its name, the directory of its files, the cgroup version."""
    with open(f"/proc/{pid}/cgroup") as lines:
        entries = [line.rstrip("\n").split(":", 2) for line in lines]
    v1 = next((path for _, controllers, path in entries if "memory" in controllers.split(",")), None)
    v2 = next((path for number, controllers, path in entries if number == "0" and not controllers), None)
    for fs_type, path, version in (("cgroup", v1, 1), ("cgroup2", v2, 2)):
        if path is None:
            continue
        mount = _mount(fs_type)
        if mount is not None:
            root, point = mount
            relative = path[len(root) :] if root != "/" and path.startswith(root) else path
            directory = os.path.join(point, relative.lstrip("/"))
            if os.path.isdir(directory):
                return path, directory, version
    return None


def _mount(fs_type: str) -> tuple[str, str] | None:
    """(root within the hierarchy, mount point) of the memory hierarchy's mount, from mountinfo."""
    with open("/proc/self/mountinfo") as lines:
        for line in lines:
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            if len(fields) < 5 or len(tail) < 3 or tail[0] != fs_type:
                continue
            if fs_type == "cgroup2" or "memory" in tail[2].split(","):
                return fields[3], fields[4]
    return None


def _watched(group: str, directory: str, version: int) -> list[tuple[str, str]]:
    """The cgroup itself, and its nearest ancestor with a memory limit (the one a container
    sets), each as (name, directory)."""
    watched = [(group, directory)]
    name, path = group, directory
    while name not in ("", "/"):
        name, path = os.path.dirname(name), os.path.dirname(path)
        if _limit(path, version) is not None:
            watched.append((name or "/", path))
            break
    return watched


def _oom_kills(directory: str, version: int) -> int | None:
    name = "memory.oom_control" if version == 1 else "memory.events"
    try:
        with open(os.path.join(directory, name)) as lines:
            for line in lines:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except FileNotFoundError:
        return None
    return None


def _limit(directory: str, version: int) -> int | None:
    name = "memory.limit_in_bytes" if version == 1 else "memory.max"
    try:
        with open(os.path.join(directory, name)) as file:
            text = file.read().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit() or int(text) >= _UNLIMITED:
        return None
    return int(text)
