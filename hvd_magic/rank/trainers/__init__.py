"""The trainers people use, feeding the live view with no hvd_magic code in the cell (rank side).

When a rank builds a Hugging Face ``Trainer`` (``hf_trainer``) or a Lightning ``Trainer``
(``lightning_trainer``), or creates an Accelerate ``Accelerator`` (``accelerate_loop``), the
rank adds its own callback: each rank reports its step, the total, the epoch, its loss and
learning rate, and the trainer's evaluation metrics, as ``hvd_magic.report`` does; the run's
first interrupt (or a preemption notice) stops every rank at the same step through the
trainer's own flag; with ``retries=`` a retried attempt resumes from the trainer's own
checkpoints (``resuming``). ``HVD_MAGIC_TRAINERS=0`` turns it off; the explicit form is
``hvd_magic.integrations.HFCallback()`` / ``LightningCallback()``.

Nothing here imports a trainer: each is patched when the user's code imports it.
"""

from __future__ import annotations

import os

from hvd_magic.protocol.env import ENV_TRAINERS
from hvd_magic.rank.after_import import when_imported

__all__ = ["watch"]


def watch() -> None:
    """Add hvd_magic's callback to each trainer this rank builds, from its import on."""
    if os.environ.get(ENV_TRAINERS, "1") == "0":
        return
    from hvd_magic.rank.trainers import accelerate_loop, hf_trainer, lightning_trainer

    when_imported(hf_trainer.MODULE, hf_trainer.patch)
    for name in lightning_trainer.MODULES:
        when_imported(name, lightning_trainer.patch)
    when_imported(accelerate_loop.MODULE, accelerate_loop.patch)
