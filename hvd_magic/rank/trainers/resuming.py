"""A trainer's own checkpoints kept by the run, and a retried attempt resumed from them (rank side).

With ``retries=`` (or ``checkpoint_dir=``) the run keeps what ``hvd_magic.checkpoint`` sends,
and a retried attempt's ranks ask for the latest with ``hvd_magic.resume()``. A trainer writes
checkpoints its own way, on its rank's disk (an executor's, on Spark, lost with it), so rank 0
also sends each one the trainer writes to the run (``keep``): a HF ``checkpoint-N`` folder's
files, a Lightning checkpoint's dictionary, an Accelerate ``save_state`` folder's files, each
marked with the trainer, the run (``HVD_MAGIC_RUN``) and which of the cell's trainings of it
wrote it (the first ``train()``, the second: ``Trainings.begin``). In a retried attempt
(``HVD_MAGIC_ATTEMPT``; never in a run's first, even where ``checkpoint_dir=`` holds an earlier
run's), a ``train()`` or ``fit()`` called without a checkpoint of its own to resume from is
given the latest the run kept where that training wrote it (``kept``), written where only this
rank reads it; an ``Accelerator`` finds the folder it saved to again (``restore_folder``) where
this rank's disk has none, so that the loop's own ``load_state`` finds it. Nothing to write in
the cell.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from hvd_magic.protocol.env import ENV_ATTEMPT, ENV_KEEP_CHECKPOINTS, ENV_RUN
from hvd_magic.rank.checkpoints import checkpoint, resume

__all__ = [
    "TRAININGS",
    "Trainings",
    "keeping",
    "private_folder",
    "read_folder",
    "restore_folder",
    "write_folder",
]

KIND = "hvd_magic.trainer"  # the key that marks a trainer's checkpoint among the run's


def keeping() -> bool:
    """Whether the run keeps checkpoints for a retry (``retries=`` or ``checkpoint_dir=``)."""
    return os.environ.get(ENV_KEEP_CHECKPOINTS) == "1"


class Trainings:
    """One rank process's trainings of each trainer and the steps it sent the run's store (an
    attempt's ranks are new processes: each has its own, ``TRAININGS``). ``checkpoint`` and
    ``resume`` are the run's (``hvd_magic.checkpoint``, ``hvd_magic.resume``)."""

    def __init__(
        self, checkpoint: Callable[..., bool] = checkpoint, resume: Callable[[], Any] = resume
    ) -> None:
        self._checkpoint, self._resume = checkpoint, resume
        self._begun: dict[str, int] = {}
        self._above: dict[tuple[str, int], int] = {}  # each training's steps go to the store above this
        self._sent = 0  # the highest step this process sent the store

    def begin(self, trainer: str, callbacks: Iterable[Any] = ()) -> int:
        """Which of this rank's trainings of ``trainer`` starts now, also set as each of
        ``callbacks``' ``training``: 1 for the cell's first ``train()`` (``fit()``,
        ``Accelerator``), 2 for the next. A retried attempt runs the cell again, so its first
        training resumes only from what the first one kept. The run's store takes its highest
        step for the latest: a training's steps are sent above those of the trainings before it
        (``keep``)."""
        training = self._begun[trainer] = self._begun.get(trainer, 0) + 1
        self._above[(trainer, training)] = self._sent
        for callback in callbacks:
            callback.training = training
        return training

    def keep(self, trainer: str, step: int, state: Any, training: int) -> bool:
        """On rank 0, where the run keeps checkpoints: ``state`` sent as the checkpoint of the
        ``training``-th training of ``trainer`` at ``step``, marked with the run (pickled now,
        sent in the background). False elsewhere."""
        if not keeping():
            return False
        mark = {KIND: trainer, "training": training, "run": os.environ.get(ENV_RUN), "step": int(step)}
        order = self._above.get((trainer, training), 0) + int(step)
        self._sent = max(self._sent, order)
        return self._checkpoint(mark | {"state": state}, step=order)

    def kept(self, trainer: str, training: int) -> tuple[int, Any] | None:
        """In a retried attempt, the latest checkpoint the run kept if this run's
        ``training``-th training of ``trainer`` wrote it (not an earlier run's, found in
        ``checkpoint_dir=``): its step and state."""
        if not keeping() or ENV_ATTEMPT not in os.environ:
            return None
        latest = self._resume()
        wrote = (trainer, training, os.environ.get(ENV_RUN))
        if (
            not isinstance(latest, dict)
            or (latest.get(KIND), latest.get("training"), latest.get("run")) != wrote
        ):
            return None
        return int(latest["step"]), latest["state"]


TRAININGS = Trainings()


def private_folder() -> str:
    """A folder of this rank's own (ranks on one host must not write each other's files)."""
    return tempfile.mkdtemp(prefix="hvd_magic-resume-")


def read_folder(folder: str) -> dict[str, bytes]:
    """Every file under ``folder``, by its path there."""
    files = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as file:
                files[os.path.relpath(path, folder)] = file.read()
    return files


def write_folder(folder: str, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = os.path.join(folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(data)


def restore_folder(folder: str, files: dict[str, bytes]) -> bool:
    """``files`` written as ``folder`` where it does not exist: whole or not at all (written
    beside it, then renamed into place; a rank on the same host that did it first wins)."""
    if os.path.exists(folder):
        return False
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    beside = tempfile.mkdtemp(prefix=".hvd_magic-restoring-", dir=parent)
    write_folder(beside, files)
    try:
        os.rename(beside, folder)
    except OSError:  # another rank restored it first
        shutil.rmtree(beside, ignore_errors=True)
        return False
    return True
