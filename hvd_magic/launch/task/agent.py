"""The exec agent inside a Spark task, and the rsh client mpirun calls instead of ssh.

mpirun starts its daemon on a "remote" host by running ``<agent> HOST orted ...``. Here the
agent command is ``python -m hvd_magic.launch.task.agent HOST orted ...``: it connects to the
ExecAgent that the Spark task on HOST serves (CURVE keys of this run, from the environment),
asks it to run the command, relays its output and exit code, and pings every second. The agent
kills the command when the caller stops pinging or disconnects, so no orted outlives its mpirun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hvd_magic.hub import CurveServer, RunKeys
from hvd_magic.launch.processes import spawn, stop_tree
from hvd_magic.launch.scratch import HeldDir
from hvd_magic.protocol import (
    ENV_AGENT_TOKEN,
    ENV_AGENTS,
    ENV_VIA_AGENT,
    Exec,
    Exit,
    Kill,
    Message,
    Output,
    Ping,
    Pong,
)
from hvd_magic.protocol.lifetime import die_with_parent
from hvd_magic.rank.hub_client import HubClient

__all__ = ["ExecAgent", "main", "open_mpi_dirs"]
PING_SECONDS = 1.0
# Generous (a loaded machine can starve a thread for seconds), yet short enough that a host cut
# off from the others is reported, and its ranks stopped, within 30 s of the cut.
PING_TIMEOUT = 12.0
PLACED_SECONDS = 60.0  # an Exec that came before this host's plan waits this long for it


class ExecAgent(CurveServer):
    """Runs commands for authenticated callers: ``Exec`` → ``Output`` messages → ``Exit``."""

    def __init__(
        self,
        bind_host: str,
        keys: RunKeys,
        host_token: str,
        host_env: dict[str, str],
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.host_token = host_token
        self.host_env = host_env
        self._placed = threading.Event()  # this host's token and environment are known
        if host_token:
            self._placed.set()
        self.say = say  # what it decides on its own, to the notebook (the task's client)
        self.launches = 0
        self._children: dict[bytes, subprocess.Popen[bytes]] = {}
        self._last_ping: dict[bytes, float] = {}
        self._lock = threading.Lock()
        self._scratch: HeldDir | None = None
        super().__init__(bind_host, keys, "hvd_magic-agent")
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._watchdog.start()

    def place(self, host_token: str, host_env: dict[str, str]) -> None:
        """This host's token and its ranks' environment (its slots' GPUs, its shards, ...), from
        the launch plan; an ``Exec`` waits for them."""
        self.host_token, self.host_env = host_token, host_env
        self._placed.set()

    def handle(self, message: Message) -> None:
        record = message.record
        if isinstance(record, Exec) and not self._placed.wait(PLACED_SECONDS):
            # mpirun reached this host before its task applied the plan, and it never did
            self.say(f"hvd_magic: the ranks of this executor were not placed within {PLACED_SECONDS:.0f} s")
            self.send_to(message.identity, Exit(1))
        elif isinstance(record, Exec):
            # Started from the server thread, which lives as long as the agent: the child's
            # PDEATHSIG then fires only if the whole task dies.
            self._start(message.identity, record.command)
        elif isinstance(record, Ping):
            self._last_ping[message.identity] = time.monotonic()
            self.send_to(message.identity, Pong())
        elif isinstance(record, Kill):
            self._kill(message.identity)

    def scratch(self) -> str:
        """This executor's own directory for Open MPI's session and shared-memory files.

        Executors sharing a machine get one "host" each; Open MPI names its shared-memory
        files and its session directories by the real hostname, so each gets its own
        directory. Two orteds creating the same session directory at once race, and the
        loser fails orte_init ("mkdir ... File exists"; mpirun exits 213). It is a
        ``HeldDir``: gone with the agent, or, if the task was killed, at the next task's start.
        """
        if self._scratch is None:
            self._scratch = HeldDir.claim()
        return self._scratch.path

    def _start(self, identity: bytes, command: str) -> None:
        env = dict(os.environ) | self.host_env | {ENV_VIA_AGENT: self.host_token}
        env |= open_mpi_dirs(self.scratch())
        child = spawn(["/bin/sh", "-c", command], env, stderr=subprocess.PIPE)
        with self._lock:
            self.launches += 1
            self._children[identity] = child
            self._last_ping[identity] = time.monotonic()
        pumps = [
            threading.Thread(target=self._pump, args=(identity, stream, name), daemon=True)
            for stream, name in ((child.stdout, "stdout"), (child.stderr, "stderr"))
        ]
        for pump in pumps:
            pump.start()
        threading.Thread(target=self._reap, args=(identity, child, pumps), daemon=True).start()

    def _pump(self, identity: bytes, stream: Any, name: str) -> None:
        while chunk := stream.read1(65536):
            self.send_to(identity, Output(name), chunk)

    def _reap(self, identity: bytes, child: subprocess.Popen[bytes], pumps: list[threading.Thread]) -> None:
        code = child.wait()
        for pump in pumps:
            pump.join(timeout=5)
        with self._lock:
            self._children.pop(identity, None)
        self.send_to(identity, Exit(code))

    def _kill(self, identity: bytes) -> None:
        with self._lock:
            child = self._children.get(identity)
        if child is not None:
            stop_tree(child)

    def _watch(self) -> None:
        while not self._stop.wait(PING_SECONDS):
            now = time.monotonic()
            with self._lock:
                silent = [i for i in self._children if now - self._last_ping.get(i, now) > PING_TIMEOUT]
            for identity in silent:
                self.say(
                    f"hvd_magic: the exec agent on {self.address} heard no ping for {PING_TIMEOUT:.0f} s "
                    "from the mpirun that started a command through it: the command is stopped"
                )
                self._kill(identity)

    def close(self) -> None:
        with self._lock:
            children = list(self._children.values())
        for child in children:
            stop_tree(child)
        super().close()
        if self._scratch is not None:
            self._scratch.remove()


def open_mpi_dirs(folder: str) -> dict[str, str]:
    """Open MPI's session directories and shared-memory files under ``folder``."""
    return {"OMPI_MCA_btl_vader_backing_directory": folder, "OMPI_MCA_orte_tmpdir_base": folder}


def main(argv: list[str]) -> int:
    """``python -m hvd_magic.launch.task.agent HOST COMMAND...`` (called by mpirun)."""
    die_with_parent()  # mpirun gone: nothing left to relay for
    host, command = argv[0], " ".join(argv[1:])
    agents = json.loads(os.environ[ENV_AGENTS])
    if host not in agents:
        print(f"hvd_magic: no exec agent for host {host!r} (known: {sorted(agents)})", file=sys.stderr)
        return 255
    client = HubClient(agents[host], os.environ[ENV_AGENT_TOKEN], rank=-1)
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    client.send(Exec(command))
    code = _relay(client, stopping, f"{host} at {agents[host]}")
    client.close()
    return code


def _relay(client: HubClient, stopping: threading.Event, where: str) -> int:
    next_ping, heard = 0.0, time.monotonic()
    while not stopping.is_set():
        now = time.monotonic()
        if now >= next_ping:
            client.send(Ping())
            next_ping = now + PING_SECONDS
        message = client.receive(timeout=0.2)
        if message is None:
            if now - heard > PING_TIMEOUT:
                print(
                    f"hvd_magic: the exec agent on {where} stopped answering for {PING_TIMEOUT:.0f} s",
                    file=sys.stderr,
                )
                return 255
            continue
        heard = time.monotonic()
        record = message.record
        if isinstance(record, Output):
            out = sys.stderr.buffer if record.stream == "stderr" else sys.stdout.buffer
            out.write(message.blob)
            out.flush()
        elif isinstance(record, Exit):
            return record.code
    client.send(Kill())
    return 143


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
