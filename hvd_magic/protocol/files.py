"""Names of the files a rank sends the notebook (``FileChunk``), which both ends must agree on."""

from __future__ import annotations

__all__ = ["CHECKPOINT_PREFIX", "checkpoint_name"]

CHECKPOINT_PREFIX = "hvd_magic-checkpoint-"


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of ``step``: names sort in step order."""
    return f"{CHECKPOINT_PREFIX}{step:012d}"
