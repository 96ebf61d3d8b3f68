"""Names of files both ends must agree on: those a rank sends the notebook (``FileChunk``), and
the fork server's note of each warm rank."""

from __future__ import annotations

import os

__all__ = ["CHECKPOINT_PREFIX", "checkpoint_name", "forked_rank_file"]

CHECKPOINT_PREFIX = "hvd_magic-checkpoint-"


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of ``step``: names sort in step order."""
    return f"{CHECKPOINT_PREFIX}{step:012d}"


def forked_rank_file(folder: str, stand_in: int) -> str:
    """Where the fork server whose socket is in ``folder`` notes the pid of the rank it forked for
    the stand-in ``stand_in`` while that rank runs: a launcher stopping a run confirms these gone
    too, not only their stand-ins."""
    return os.path.join(folder, f"rank-of-{stand_in}")
