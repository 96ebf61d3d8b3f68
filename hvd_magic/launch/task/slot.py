"""A Spark task holding its slot while its rank runs: the rank's output forwarded, its end
reported (with what its host saw of it), the notebook's asks answered, until it is released."""

from __future__ import annotations

import os
import subprocess
import threading

from hvd_magic.launch import native, processes
from hvd_magic.launch.memory_cgroup import MemoryWatch
from hvd_magic.protocol import Abort, LauncherExit, LauncherLog, NativeAsked, Release
from hvd_magic.rank.client import LOST_SECONDS, HubClient

__all__ = ["hold_slot", "say"]


def hold_slot(client: HubClient, process: subprocess.Popen[bytes] | None) -> int:
    """Forward the process's output, report its exit, and keep the slot until released."""
    reader = None
    if process is not None:
        reader = threading.Thread(target=_forward, args=(process, client), daemon=True)
        reader.start()
    code, reported = 0, process is None
    memory = None  # the memory cgroup where an OOM kill of the process would be counted
    if process is not None:
        memory = MemoryWatch.of(process.pid) or MemoryWatch.of(os.getpid())
    while True:
        if not reported and process is not None and process.poll() is not None:
            if reader is not None:
                reader.join(timeout=5)
            code, reported = process.returncode, True
            death = processes.death_of(-1, code, memory=memory)
            client.send(LauncherExit(code, death.what, death.failure.name) if code else LauncherExit(0))
        answer = client.receive(timeout=0.2)
        if answer is None and (lost := client.lost_for()) > LOST_SECONDS:  # no one releases it now
            if process is not None:
                lost_line = f"lost the notebook's connection {lost:.1f} s ago: its ranks are stopped"
                say(client, f"hvd_magic: a Spark task {lost_line}")  # heard if the connection comes back
                processes.stop_tree(process)
            return code
        if answer is None:
            continue
        if isinstance(answer.record, NativeAsked):  # py-spy takes a while: the loop goes on
            threading.Thread(target=native.answer, args=(client.send, answer.record), daemon=True).start()
        if isinstance(answer.record, Abort) and process is not None:
            processes.stop_tree(process)
            code = process.wait()
        if isinstance(answer.record, (Release, Abort)):
            return code


def say(client: HubClient, line: str) -> None:
    """A line of the task's own into the launcher's output at the notebook."""
    client.send(LauncherLog(), line.encode())


def _forward(process: subprocess.Popen[bytes], client: HubClient) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        client.send(LauncherLog(), line)
        if client.closed:  # the task ended before its output did: Spark keeps its Python worker
            return
