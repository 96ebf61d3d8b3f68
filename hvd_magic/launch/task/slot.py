"""A Spark task holding its slot while its rank runs: the rank's output forwarded, its end
reported (with what its host saw of it), the notebook's asks answered, until it is released."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

from hvd_magic.launch import native, processes
from hvd_magic.launch.memory_cgroup import MemoryWatch
from hvd_magic.protocol import Abort, LauncherExit, LauncherLog, NativeAsked, Release
from hvd_magic.rank.hub_client import LOST_SECONDS, HubClient

__all__ = ["hold_slot", "say"]


def hold_slot(client: HubClient, process: subprocess.Popen[bytes] | None) -> int:
    """Forward the process's output, report its exit as soon as it comes, and keep the slot
    until released."""
    stopping = threading.Event()  # the task was told to stop it: its end is no news
    if process is not None:
        reader = threading.Thread(target=_forward, args=(process, client), daemon=True)
        reader.start()
        memory = MemoryWatch.of(process.pid) or MemoryWatch.of(os.getpid())  # where an OOM kill counts
        watch = (client, process, reader, memory, stopping)
        threading.Thread(target=_report_end, args=watch, name="hvd_magic-task-exit", daemon=True).start()
    while True:
        answer = client.receive(timeout=0.2)
        if answer is None and (lost := client.lost_for()) > LOST_SECONDS:  # no one releases it now
            if process is not None:
                lost_line = f"lost the notebook's connection {lost:.1f} s ago: its ranks are stopped"
                say(client, f"hvd_magic: a Spark task {lost_line}")  # heard if the connection comes back
                stopping.set()
                processes.stop_tree(process)
            return _code(process)
        if answer is None:
            continue
        if isinstance(answer.record, NativeAsked):  # py-spy takes a while: the loop goes on
            threading.Thread(target=native.answer, args=(client.send, answer.record), daemon=True).start()
        if isinstance(answer.record, Abort) and process is not None:
            stopping.set()
            processes.stop_tree(process)
            process.wait()
        if isinstance(answer.record, (Release, Abort)):
            return _code(process)


def _code(process: subprocess.Popen[bytes] | None) -> int:
    """The process's exit code once it ended (0 for none, or one still running)."""
    return 0 if process is None or process.poll() is None else process.returncode


def _report_end(
    client: HubClient,
    process: subprocess.Popen[bytes],
    reader: threading.Thread,
    memory: MemoryWatch | None,
    stopping: threading.Event,
) -> None:
    """Tell the driver the process ended, and how, the moment it does (a pidfd wakes this
    thread: the driver releases the tasks on it); its output is forwarded first."""
    try:
        pidfd: int | None = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux 5.3 or newer: looked at 20 times a second
        pidfd = None
    try:
        while process.poll() is None:
            if client.closed or stopping.is_set():
                return
            if pidfd is not None:
                select.select([pidfd], [], [], 0.2)
            else:
                time.sleep(0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    reader.join(timeout=5)
    if stopping.is_set():
        return
    code = process.returncode
    death = processes.death_of(-1, code, memory=memory)
    client.send(LauncherExit(code, death.what, death.failure.name) if code else LauncherExit(0))


def say(client: HubClient, line: str) -> None:
    """A line of the task's own into the launcher's output at the notebook."""
    client.send(LauncherLog(), line.encode())


def _forward(process: subprocess.Popen[bytes], client: HubClient) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        client.send(LauncherLog(), line)
        if client.closed:  # the task ended before its output did: Spark keeps its Python worker
            return
