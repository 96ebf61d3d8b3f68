"""Launchers start the ranks of one run and stop them; they know nothing of widgets.

``create(options)`` picks one: ranks on this host (np < 0) through ``mpirun`` or Horovod's Gloo,
or on a Spark cluster (np > 0). ``Launcher`` is the small interface a run's supervision drives.

    base        the Launcher interface
    processes   spawn (parent-death signal), stop escalation, thread budget, RankDeath
    mpirun      mpirun's command line, its report of a death or of a lost host
    gloo        Horovod's Gloo layout, the ranks' environment, the loopback rendezvous store
    torch_dist  torch.distributed ranks (backend=torch): their env:// environment
    local       LocalMpiLauncher, LocalGlooLauncher, LocalTorchLauncher
    spark       SparkLauncher (the driver side of one barrier stage)
    spark_session  finding or starting the SparkSession, its slots
    spark_plan  the plan the tasks get; which ranks a lost host took with it
    scratch     a task's directory for Open MPI's files, removed even if the task is SIGKILLed
    task/       what runs inside each Spark task: barrier (the task's body), agent (the exec
                agent, and the rsh client mpirun calls instead of ssh), network (its address)

Warm ranks (forked from a server that imported the framework once) are ``hvd_magic.warm``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hvd_magic.launch.base import Launcher
from hvd_magic.launch.processes import RankDeath

if TYPE_CHECKING:
    from hvd_magic.options import RunOptions

__all__ = ["Launcher", "RankDeath", "create", "slots_now"]


def create(options: RunOptions, imports: frozenset[str] = frozenset()) -> Launcher:
    """The launcher for these options; on Spark this finds (or starts) the session. With
    ``data=`` the shards are planned here, so bad data fails before anything launches.
    ``imports``: the modules the ranks' code imports (warm.choice: which ranks are forked)."""
    from hvd_magic.warm.choice import warm_modules

    warm = warm_modules(imports, here=options.np < 0)
    if options.np < 0:
        from hvd_magic.launch.local import LocalGlooLauncher, LocalMpiLauncher, LocalTorchLauncher

        if options.launcher == "torch":
            return LocalTorchLauncher.for_options(options, warm)
        if options.launcher == "gloo":
            return LocalGlooLauncher.for_options(options, warm)
        return LocalMpiLauncher.for_options(options, warm)
    from hvd_magic.launch.spark import SparkLauncher

    return SparkLauncher.for_options(options, warm)


def slots_now(options: RunOptions) -> int | None:
    """How many ranks could run at once now: a Spark cluster's slots (its live executors');
    None on this machine, or where the cluster does not tell (Spark Connect)."""
    if options.np < 0:
        return None
    from hvd_magic.launch.embedded_spark import active_or_embedded_session
    from hvd_magic.launch.spark_session import is_connect, slots_available

    session = getattr(options.data, "sparkSession", None) or active_or_embedded_session()
    return None if is_connect(session) else slots_available(session)
