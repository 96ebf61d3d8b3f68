"""A Hugging Face ``Trainer``'s steps in the live view, and its graceful stop (rank side).

``HFCallback`` reports each optimizer step (``state.global_step`` of ``state.max_steps``, the
epoch), the rank's own loss (read from ``training_step`` at most ten times a second), the
learning rate, and what the trainer logs (evaluation's metrics, ``grad_norm``). At each step's
end it asks whether the run is to stop (``StoppingLate``: the ranks agree on the step, no rank
waits for the others) and, when it is, sets ``control.should_training_stop`` and ``should_save``: the trainer
writes its checkpoint and ``train()`` returns. With ``retries=``, each checkpoint the trainer
writes is kept by the run too, and a retried attempt's ``train()`` resumes from the latest
(``resuming``). Built on first use (importing hvd_magic imports no transformers); added to
every ``Trainer`` the rank builds (``patch``).
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from types import ModuleType
from typing import Any

from hvd_magic.rank.checkpoints import StoppingLate
from hvd_magic.rank.reporting import report
from hvd_magic.rank.trainers import resuming
from hvd_magic.rank.trainers.readings import LossReading, numbers

__all__ = ["MODULE", "callback_class", "patch"]

MODULE = "transformers.trainer"
# What HF logs that is not a curve of ours: its loss (the mean of every rank's over
# logging_steps; each rank's own is reported at its steps), the learning rate (also reported at
# each step), the epoch, and speeds and totals
NOT_CURVES = ("loss", "learning_rate", "epoch", "total_flos")
NOT_CURVE_ENDINGS = ("_runtime", "_per_second")


class _HFCallbackMixin:
    """Reports a HF ``Trainer``'s steps, loss, learning rate and logs; stops it gracefully."""

    def __init__(self, stoppable: bool = True) -> None:
        super().__init__()
        self.stoppable = stoppable
        self.loss: Any = None  # the step's loss: the sum of its training_step values (accumulation's)
        self.training = 1  # which of the cell's train() calls this is (resuming.Trainings.begin)
        self._reading = LossReading()
        self._stopping = StoppingLate()  # asked each step, answered a few steps late: no wait added

    def watch(self, trainer: Any) -> None:
        """Keep each of ``trainer``'s step losses (its ``training_step``'s value)."""
        step, me = trainer.training_step, weakref.ref(self)

        @functools.wraps(step)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            loss = step(*args, **kwargs)  # divided by the accumulation's steps, as the trainer sums it
            if (callback := me()) is not None:
                callback.loss = loss if callback.loss is None else callback.loss + loss
            return loss

        trainer.training_step = training_step

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loss = None  # what a train() that ended mid-accumulation summed is not this one's

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        metrics: dict[str, Any] = {}
        loss, self.loss = self.loss, None
        if (loss := self._reading.read(loss)) is not None:
            metrics["loss"] = loss
        scheduler = kwargs.get("lr_scheduler")
        if scheduler is not None and hasattr(scheduler, "get_last_lr"):
            metrics["learning_rate"] = float(scheduler.get_last_lr()[0])
        total = state.max_steps if state.max_steps and state.max_steps > 0 else None
        epoch = max(0, math.ceil(state.epoch or 0) - 1)  # the one the step is in (HF's counts ends)
        report(step=state.global_step, total=total, epoch=epoch, **metrics)
        if self.stoppable and self._stopping():
            control.should_training_stop = True
            control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The checkpoint the trainer just wrote, kept by the run too (rank 0; ``resuming``), once
        every rank has written its part (each its ``rng_state_N.pth``: the trainer waits for none)."""
        if not resuming.keeping():
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank saves at the same steps, so every rank is here
        if args.process_index == 0:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            resuming.TRAININGS.keep("hf", state.global_step, resuming.read_folder(folder), self.training)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """What the trainer logs, evaluation's metrics too (``evaluate`` logs them)."""
        found = numbers(logs, leave=NOT_CURVES)
        if found := {name: value for name, value in found.items() if not name.endswith(NOT_CURVE_ENDINGS)}:
            report(**found)


@functools.cache
def callback_class() -> type:
    """``HFCallback``: a ``transformers.TrainerCallback`` (imported here, on first use)."""
    from transformers import TrainerCallback

    return type("HFCallback", (_HFCallbackMixin, TrainerCallback), {"__doc__": _HFCallbackMixin.__doc__})


def patch(module: ModuleType) -> None:
    """Every ``Trainer`` built from now on has an ``HFCallback`` (the user's own, if given)."""
    trainer_class = module.Trainer
    if getattr(trainer_class, "_hvd_magic_watched", False):
        return
    init = trainer_class.__init__

    @functools.wraps(init)
    def init_watched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        mine = callback_class()
        found: list[Any] = [c for c in self.callback_handler.callbacks if isinstance(c, mine)]
        if not found:
            found = [mine()]
            self.add_callback(found[0])
        found[0].watch(self)
        if (accelerator := getattr(self, "accelerator", None)) is not None:
            accelerator._hvd_magic_quiet = True  # the trainer's steps are the callback's to say

    train = trainer_class.train

    @functools.wraps(train)
    def train_resumed(self: Any, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        mine = [c for c in self.callback_handler.callbacks if isinstance(c, _HFCallbackMixin)]
        training = resuming.TRAININGS.begin("hf", mine)
        if resume_from_checkpoint is None:
            resume_from_checkpoint = _kept_checkpoint(training)
        return train(self, resume_from_checkpoint, *args, **kwargs)

    trainer_class.__init__ = init_watched
    trainer_class.train = train_resumed
    trainer_class._hvd_magic_watched = True


def _kept_checkpoint(training: int) -> str | None:
    """The run's copy of the ``training``-th ``train()``'s latest checkpoint, written as a
    ``checkpoint-N`` folder of this rank's own, in a retried attempt (its files are not held on
    to while the trainer trains)."""
    found = resuming.TRAININGS.kept("hf", training)
    if found is None:
        return None
    folder = os.path.join(resuming.private_folder(), f"checkpoint-{found[0]}")
    resuming.write_folder(folder, found[1])
    return folder
