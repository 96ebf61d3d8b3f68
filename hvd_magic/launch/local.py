"""Ranks on this host: ``mpirun`` (Open MPI) or Horovod's Gloo rendezvous, for np < 0."""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import threading
from typing import IO

import psutil

from ..errors import LaunchError
from . import Launcher, LaunchPlan, RankDeath, death_of, mpirun_deaths, spawn
from .rendezvous import GlooStore, LoopbackStoreServer, gloo_slots

__all__ = ["LocalGlooLauncher", "LocalMpiLauncher", "mpirun_argv", "stop_processes", "stop_tree"]

_TAIL_LINES = 200
STOP_GRACE_SECONDS = 1.5


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


def stop_processes(processes: list[psutil.Process], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGINT, then SIGTERM, then SIGKILL, waiting ``grace`` seconds between steps."""
    alive = [p for p in processes if p.is_running()]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        for process in alive:
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace)
        if not alive:
            return


def stop_tree(pid: int) -> None:
    """Stop a process and all its descendants (see ``stop_processes``)."""
    try:
        parent = psutil.Process(pid)
        stop_processes([parent, *parent.children(recursive=True)])
    except psutil.NoSuchProcess:
        pass


class _OutputTail:
    """Reads a process's output on a thread and keeps the last lines for error messages."""

    def __init__(self, stream: IO[bytes] | None) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    def text(self) -> str:
        self._thread.join(timeout=1)
        return "\n".join(self.lines)


class _ProcessGroupLauncher(Launcher):
    """Common part: processes in new sessions, stopped together with their descendants."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.processes: list[subprocess.Popen[bytes]] = []
        self.tails: list[_OutputTail] = []

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        process = spawn(argv, env, cwd=self.plan.cwd)
        self.processes.append(process)
        self.tails.append(_OutputTail(process.stdout))

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.processes]
        if any(code is None for code in codes):
            return None
        return next((code for code in codes if code), 0)

    def stop(self) -> None:
        family: list[psutil.Process] = []
        for process in self.processes:
            try:
                parent = psutil.Process(process.pid)
                family += [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        stop_processes(family)
        for process in self.processes:
            process.wait()

    def diagnostics(self) -> str:
        return "\n".join(tail.text() for tail in self.tails).strip()

    def base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.plan.env)
        path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = self.plan.cwd + (os.pathsep + path if path else "")
        env["PYTHONUNBUFFERED"] = "1"
        return env


class LocalMpiLauncher(_ProcessGroupLauncher):
    """``mpirun -np N`` on this host."""

    def start(self) -> None:
        if shutil.which("mpirun") is None:
            raise LaunchError(
                "mpirun was not found on this machine. Install Open MPI (Debian/Ubuntu: "
                "`apt-get install openmpi-bin libopenmpi-dev`) or use launcher=gloo."
            )
        argv = mpirun_argv(self.plan.np, self.plan.command, as_root=os.geteuid() == 0)
        self._spawn(argv, self.base_env())

    def deaths(self) -> list[RankDeath]:
        return mpirun_deaths("\n".join(list(self.tails[0].lines))) if self.tails else []


class LocalGlooLauncher(_ProcessGroupLauncher):
    """N processes with Horovod's Gloo rendezvous, the store served to them on loopback."""

    def start(self) -> None:
        slots = gloo_slots([("localhost", self.plan.np)])
        self._deaths: list[RankDeath] = []
        self._server = LoopbackStoreServer(GlooStore(slots).request)
        env = self.base_env() | {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self._server.port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": "lo",
        }
        for slot in slots:
            self._spawn(
                self.plan.command, env | {f"HOROVOD_{key.upper()}": str(value) for key, value in slot.items()}
            )

    def deaths(self) -> list[RankDeath]:
        """Processes are in rank order; each death is kept in the order it was first seen."""
        seen = {death.rank for death in self._deaths}
        for rank, process in enumerate(self.processes):
            code = process.poll()
            if code and rank not in seen:
                self._deaths.append(death_of(rank, code))
        return list(self._deaths)

    def stop(self) -> None:
        super().stop()
        server: LoopbackStoreServer | None = getattr(self, "_server", None)
        if server is not None:
            server.close()
            del self._server
