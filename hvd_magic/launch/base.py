"""The interface every launcher implements; a run's supervision drives nothing else."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from hvd_magic.launch import native
from hvd_magic.launch.processes import RankDeath

if TYPE_CHECKING:
    from hvd_magic.hub import Hub

__all__ = ["HOW", "Launcher"]

# how the ranks start, by the options' launcher= (backend=torch: torch), in the words the record shows
HOW = {"mpi": "Horovod (mpirun)", "gloo": "Horovod (Gloo)", "torch": "torch.distributed"}


class Launcher:
    """What a run's supervision drives. ``bind_host`` is where the run's hub must listen for the ranks."""

    bind_host = "127.0.0.1"
    notices: list[str] = []  # told to the user before the run (e.g. how data= was split)
    # what stopped the whole run from outside, where the launcher can tell ("Spark cancelled the
    # run's tasks (...)"): the run's failure, not a rank's
    ended_by: str | None = None
    kind = ""  # how its ranks start: mpi, gloo or torch (a key of HOW), where it starts ranks itself

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        """Start the ranks; ``env`` (the hub's address and keys among it) goes to every rank."""
        raise NotImplementedError

    def poll(self) -> int | None:
        """The job's exit code once every process ended, else None."""
        raise NotImplementedError

    def stop(self) -> list[str]:
        """Stop every process of the job (SIGINT, then SIGTERM, then SIGKILL) and return only
        once they are gone, or a bound passed: then the list says what is still being
        stopped, and where. Safe to call again."""
        raise NotImplementedError

    def describe(self) -> str:
        """What launched the run, in a few words, for the kernel's record of its runs and the
        Horovod panel: where the ranks run, then how they start (``local · Horovod (Gloo)``).
        Asked once an attempt, on the kernel's thread."""
        return " · ".join(part for part in ("local", HOW.get(self.kind, self.kind)) if part)

    def diagnostics(self) -> str:
        """The launcher's own output (e.g. mpirun's error block), bounded."""
        return ""

    def exited(self) -> dict[int, int]:
        """The ranks whose process has ended while others may still run, and their exit codes,
        where the launcher can tell at no cost (a process a rank, started here); none elsewhere
        (mpirun and Spark end the whole job: ``poll``). A live session's ranks never end alone."""
        return {}

    def said(self) -> list[str]:
        """What the parts of the launcher that run beside the ranks decided on their own and
        said (a Spark task that stopped its ranks, an exec agent whose caller went silent):
        the lines of its output that hvd_magic wrote, cheap to ask at any time."""
        return []

    def preempted(self) -> str | None:
        """A notice that the ranks' machines are about to go (a decommissioned executor), once
        one came; None where there is none or the launcher cannot tell."""
        return None

    def native_stacks(self, pids: dict[int, int], hosts: dict[int, str]) -> dict[int, str]:
        """py-spy's dump (native frames too) of each rank in ``pids`` (rank → pid) that the
        launcher can reach; here, those on this machine (``hosts``: each rank's host name)."""
        here = socket.gethostname()
        return native.dumps({rank: pid for rank, pid in pids.items() if hosts.get(rank) == here})

    def deaths(self) -> list[RankDeath]:
        """Ranks seen to end badly, in the order seen, where the launcher can tell (some of
        them may have reported an error before they ended)."""
        return []
