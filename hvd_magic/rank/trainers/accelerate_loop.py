"""An Accelerate loop's steps in the live view, and its graceful stop (rank side).

An Accelerate loop is the user's own, so hvd_magic reads it where it goes through the
``Accelerator``: each ``backward`` that ends an accumulation (``sync_gradients``) is a step,
reported with the rank's loss (read at most ten times a second); what the loop logs with
``Accelerator.log`` is reported from every rank (Accelerate's trackers get it on the main process
only, as before); and ``Accelerator.check_trigger()``, Accelerate's own way for a loop to stop
on every process at once, also says True once the run is asked to stop (``hvd_magic.stopping()``,
at the same place on every rank). Where the run keeps checkpoints (``retries=``), each
``save_state`` folder is kept too, and a retried attempt's ``Accelerator`` restores the latest
where this rank's disk lacks it (``resuming``): the loop's own ``load_state`` resumes from it.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Any

from hvd_magic.rank.checkpoints import stopping
from hvd_magic.rank.reporting import report
from hvd_magic.rank.trainers import resuming
from hvd_magic.rank.trainers.readings import LossReading, numbers

__all__ = ["MODULE", "patch"]

MODULE = "accelerate.accelerator"
_reading = LossReading()


def patch(module: ModuleType) -> None:
    accelerator = module.Accelerator
    if getattr(accelerator, "_hvd_magic_watched", False):
        return
    backward, log, check_trigger = accelerator.backward, accelerator.log, accelerator.check_trigger
    init, save_state = accelerator.__init__, accelerator.save_state

    @functools.wraps(init)
    def init_restoring(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _restore(self)

    @functools.wraps(save_state)
    def save_state_kept(self: Any, *args: Any, **kwargs: Any) -> Any:
        location = save_state(self, *args, **kwargs)
        if resuming.keeping() and location is not None:
            _keep(self, location)
        return location

    @functools.wraps(backward)
    def backward_counted(self: Any, loss: Any, **kwargs: Any) -> Any:
        done = backward(self, loss, **kwargs)
        if self.sync_gradients and not getattr(self, "_hvd_magic_quiet", False):  # HF's: its callback's
            self._hvd_magic_steps = getattr(self, "_hvd_magic_steps", 0) + 1
            metrics: dict[str, Any] = {} if (value := _reading.read(loss)) is None else {"loss": value}
            report(step=self._hvd_magic_steps, **metrics)
        return done

    @functools.wraps(log)
    def log_reported(self: Any, values: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if found := numbers(values):
            report(**found)
        return log(self, values, *args, **kwargs)

    @functools.wraps(check_trigger)
    def check_trigger_or_stop(self: Any) -> bool:
        return bool(check_trigger(self)) or stopping()

    accelerator.backward = backward_counted
    accelerator.log = log_reported
    accelerator.check_trigger = check_trigger_or_stop
    accelerator.__init__ = init_restoring
    accelerator.save_state = save_state_kept
    accelerator._hvd_magic_watched = True


def _restore(accelerator: Any) -> None:
    """In a retried attempt, the folder the latest checkpoint of this ``Accelerator``'s training
    was saved to, written back where this rank's disk lacks it."""
    accelerator._hvd_magic_training = resuming.TRAININGS.begin("accelerate")
    if (found := resuming.TRAININGS.kept("accelerate", accelerator._hvd_magic_training)) is not None:
        resuming.restore_folder(found[1]["folder"], found[1]["files"])
        accelerator._hvd_magic_steps = found[0]  # its steps go on from there: the next kept is the latest


def _keep(accelerator: Any, location: str) -> None:
    """The folder ``save_state`` wrote, kept by the run (rank 0) once every rank wrote its part."""
    accelerator.wait_for_everyone()  # every rank's files written (those on this host: its RNG's)
    if accelerator.is_main_process:
        folder = os.path.abspath(location)
        kept = {"folder": folder, "files": resuming.read_folder(folder)}
        steps = getattr(accelerator, "_hvd_magic_steps", 0)
        resuming.TRAININGS.keep("accelerate", steps, kept, accelerator._hvd_magic_training)
