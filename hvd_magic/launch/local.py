"""Ranks on this host: ``mpirun`` (Open MPI) or Horovod's Gloo rendezvous, for np < 0."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from typing import TYPE_CHECKING

from hvd_magic.data.source import local_shards
from hvd_magic.errors import FailureClass, LaunchError
from hvd_magic.launch.base import Launcher
from hvd_magic.launch.gloo import GlooStore, LoopbackStoreServer, gloo_env, gloo_slots
from hvd_magic.launch.memory_cgroup import MemoryWatch
from hvd_magic.launch.mpirun import idle_wait_env, mpirun_argv, mpirun_deaths
from hvd_magic.launch.processes import (
    OutputTail,
    RankDeath,
    death_of,
    describe,
    family_of,
    spawn,
    stop_and_confirm,
    thread_budget_env,
)
from hvd_magic.launch.torch_dist import reserve_port, torch_env
from hvd_magic.protocol import ENV_SHARDS
from hvd_magic.warm.servers import forked_ranks, rank_command, serving

if TYPE_CHECKING:
    from hvd_magic.hub import Hub
    from hvd_magic.options import RunOptions

__all__ = ["LocalGlooLauncher", "LocalMpiLauncher", "LocalTorchLauncher"]


class _ProcessGroupLauncher(Launcher):
    """Common part: processes in new sessions, stopped together with their descendants."""

    def __init__(
        self, np: int, cwd: str | None = None, shards: list[str] | None = None, warm: tuple[str, ...] = ()
    ) -> None:
        self.np = np
        self.cwd = cwd or os.getcwd()
        self.shards = shards or []  # data=: rank -> its shard file, written by the notebook
        self.warm = warm  # what the fork server the ranks are forked from preloads (warm.servers)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.tails: list[OutputTail] = []
        self.memory: list[MemoryWatch | None] = []  # each process's memory cgroup, from its start

    @classmethod
    def for_options(cls, options: RunOptions, warm: tuple[str, ...] = ()) -> _ProcessGroupLauncher:
        """With ``data=``, the shards are written (and bad data refused) before anything starts."""
        if options.data is None:
            return cls(options.ranks, warm=warm)
        directory = tempfile.mkdtemp(prefix="hvd_magic-shards-")
        try:
            shards, notice = local_shards(
                options.data, options.data_name, options.ranks, options.keep_remainder, directory
            )
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        launcher = cls(options.ranks, shards=shards, warm=warm)
        launcher.notices = [notice]
        return launcher

    def rank_command(self, env: dict[str, str]) -> list[str]:
        """Each rank's command: a stand-in for a rank forked warm, where it can be, else the rank."""
        return rank_command(serving(self.warm, env) if self.warm else None)

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        process = spawn(argv, env, cwd=self.cwd)
        self.processes.append(process)
        self.tails.append(OutputTail(process.stdout))
        self.memory.append(MemoryWatch.of(process.pid) or MemoryWatch.of(os.getpid()))  # inherited

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.processes]
        if not codes or any(code is None for code in codes):  # none yet: it is starting (a fork server)
            return None
        return next((code for code in codes if code), 0)

    def stop(self) -> list[str]:
        family = [member for process in self.processes for member in family_of(process)]
        forked = forked_ranks(family)  # warm ranks: not below their stand-ins, but gone with them
        remaining = stop_and_confirm(family) + stop_and_confirm(forked)
        for process in self.processes:
            process.poll()  # reap it
        if self.shards:
            shutil.rmtree(os.path.dirname(self.shards[0]), ignore_errors=True)
        return [f"{describe(process)} (on this machine)" for process in remaining]

    def diagnostics(self) -> str:
        return "\n".join(tail.text() for tail in self.tails).strip()

    def base_env(self, env: dict[str, str]) -> dict[str, str]:
        """This process's environment, the run's, and a thread budget for this host's ranks."""
        merged = dict(os.environ) | thread_budget_env(self.np, os.cpu_count() or 1, env) | env
        path = merged.get("PYTHONPATH", "")
        merged["PYTHONPATH"] = self.cwd + (os.pathsep + path if path else "")
        merged["PYTHONUNBUFFERED"] = "1"
        if self.shards:
            merged[ENV_SHARDS] = json.dumps(self.shards)  # local rank = rank on one host
        return merged


class LocalMpiLauncher(_ProcessGroupLauncher):
    """``mpirun -np N`` on this host."""

    kind = "mpi"

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        if shutil.which("mpirun") is None:
            raise LaunchError(
                "mpirun was not found on this machine. Install Open MPI (Debian/Ubuntu: "
                "`apt-get install openmpi-bin libopenmpi-dev`) or use launcher=gloo."
            )
        argv = mpirun_argv(self.np, self.rank_command(env), as_root=os.geteuid() == 0)
        merged = self.base_env(env)
        self._spawn(argv, merged | idle_wait_env(merged))

    def deaths(self) -> list[RankDeath]:
        return mpirun_deaths("\n".join(list(self.tails[0].lines)), self.memory[0]) if self.tails else []


class _ProcessPerRankLauncher(_ProcessGroupLauncher):
    """One process per rank, started here in rank order: each death is seen in its status."""

    def __init__(
        self, np: int, cwd: str | None = None, shards: list[str] | None = None, warm: tuple[str, ...] = ()
    ) -> None:
        super().__init__(np, cwd, shards, warm)
        self._deaths: list[RankDeath] = []  # in the order first seen (a poll may come before start)

    def exited(self) -> dict[int, int]:
        codes = {rank: process.poll() for rank, process in enumerate(self.processes)}
        return {rank: code for rank, code in codes.items() if code is not None}

    def poll(self) -> int | None:
        self._note_deaths()  # at every look: the first death is the cause, named first
        return super().poll()

    def deaths(self) -> list[RankDeath]:
        """Each death in the order it was first seen (a poll ten times a second); of those seen
        at once, a kill (the OOM killer's) before what it brings about (another rank's abort)."""
        self._note_deaths()
        return list(self._deaths)

    def _note_deaths(self) -> None:
        seen = {death.rank for death in self._deaths}
        new = [
            death_of(rank, code, memory=self.memory[rank])
            for rank, process in enumerate(self.processes)
            if (code := process.poll()) and rank not in seen
        ]
        kills = (FailureClass.OOM, FailureClass.KILLED)
        self._deaths += sorted(new, key=lambda death: death.failure not in kills)


class LocalGlooLauncher(_ProcessPerRankLauncher):
    """N processes with Horovod's Gloo rendezvous, the store served to them on loopback."""

    kind = "gloo"

    _server: LoopbackStoreServer | None = None

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        slots = gloo_slots([("localhost", self.np)])
        self._server = LoopbackStoreServer(GlooStore(slots).request)
        base, command = self.base_env(env), self.rank_command(env)
        for slot in slots:
            self._spawn(command, base | gloo_env(slot, self._server.port, "lo"))

    def stop(self) -> list[str]:
        remaining = super().stop()
        if self._server is not None:
            self._server.close()
            self._server = None
        return remaining


class LocalTorchLauncher(_ProcessPerRankLauncher):
    """N torch.distributed processes (``backend=torch``), rank 0's store reached on loopback."""

    kind = "torch"

    _held: socket.socket | None = None  # rank 0's store's port, held until the ranks are gone

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        self._held = reserve_port()
        base, port, command = self.base_env(env), self._held.getsockname()[1], self.rank_command(env)
        for slot in gloo_slots([("localhost", self.np)]):
            self._spawn(command, base | torch_env(slot, "127.0.0.1", port))

    def stop(self) -> list[str]:
        try:
            return super().stop()
        finally:
            if self._held is not None:
                self._held.close()
                self._held = None
