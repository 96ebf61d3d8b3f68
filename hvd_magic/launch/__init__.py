"""Launchers start the ranks of one run and stop them; they know nothing of widgets.

``LaunchPlan`` is plain data; each launcher turns it into processes. ``Launcher`` is the small
interface the engine drives: ``start``, ``poll``, ``stop``, ``diagnostics``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["LaunchPlan", "Launcher", "thread_budget_env"]

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")


@dataclass
class LaunchPlan:
    """What to run: ``np`` ranks of ``command`` with ``env`` added to the environment."""

    np: int
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = field(default_factory=os.getcwd)
    launcher: str = "mpi"  # "mpi" or "gloo"


def thread_budget_env(local_ranks: int, cores: int, user_env: dict[str, str]) -> dict[str, str]:
    """CPU threads per rank = cores / ranks on the host, unless the user chose a number.

    Without it every rank starts one intra-op thread per core and N ranks on N cores
    oversubscribe: a small torch script ran ~4x slower here.
    """
    if any(var in user_env or var in os.environ for var in THREAD_VARS):
        return {}
    threads = str(max(1, cores // max(1, local_ranks)))
    return {var: threads for var in THREAD_VARS} | {"TF_NUM_INTEROP_THREADS": "1"}


class Launcher:
    """Interface of a launcher (see launch.local for the implementations)."""

    def start(self) -> None:
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
