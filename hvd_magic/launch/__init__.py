"""Launchers start the ranks of one run and stop them; they know nothing of widgets.

``create(options)`` picks one: ranks on this host (np < 0) through ``mpirun`` or Horovod's Gloo,
or on a Spark cluster (np > 0). ``Launcher`` is the small interface the engine drives.

    processes   spawn (parent-death signal), stop escalation, thread budget, RankDeath
    mpirun      mpirun's command line, its report of a death
    gloo        Horovod's Gloo layout, the ranks' environment, the loopback rendezvous store
    local       LocalMpiLauncher, LocalGlooLauncher
    spark       SparkLauncher (the driver side of one barrier stage)
    spark_session  finding or starting the SparkSession, its slots
    spark_task  what each barrier task runs on its executor
    agent       the exec agent in a task, and the rsh client mpirun calls instead of ssh
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .processes import RankDeath

if TYPE_CHECKING:
    from ..hub import Hub
    from ..options import RunOptions

__all__ = ["Launcher", "RankDeath", "create"]


class Launcher:
    """What the engine drives. ``bind_host`` is where the run's hub must listen for the ranks."""

    bind_host = "127.0.0.1"

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        """Start the ranks; ``env`` (the hub's address and keys among it) goes to every rank."""
        raise NotImplementedError

    def poll(self) -> int | None:
        """The job's exit code once every process ended, else None."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop every process of the job: SIGINT, then SIGTERM, then SIGKILL."""
        raise NotImplementedError

    def diagnostics(self) -> str:
        """The launcher's own output (e.g. mpirun's error block), bounded."""
        return ""

    def deaths(self) -> list[RankDeath]:
        """Ranks seen to end badly, in the order seen, where the launcher can tell (some of
        them may have reported an error before they ended)."""
        return []


def create(options: RunOptions) -> Launcher:
    """The launcher for these options; on Spark this finds (or starts) the session."""
    if options.np < 0:
        from .local import LocalGlooLauncher, LocalMpiLauncher

        if options.launcher == "gloo":
            return LocalGlooLauncher(options.ranks)
        return LocalMpiLauncher(options.ranks)
    from .spark import SparkLauncher

    return SparkLauncher.on_active_session(options.ranks, options.launcher)
