"""A Lightning ``Trainer``'s steps in the live view, its graceful stop, and its process layout
checked against the run's (rank side).

``LightningCallback`` reports each optimizer step (``trainer.global_step`` of
``estimated_stepping_batches``, the epoch), the rank's loss (the step's batches' losses summed,
read at most ten times a second), the learning rate and the validation metrics. After each batch
it asks whether the run is to stop (``StoppingLate``: the ranks agree on the batch, no rank waits
for the others) and, when it is, sets ``trainer.should_stop``: ``fit`` ends as an early stop
does. With ``retries=``, each checkpoint Lightning writes is kept by the run too, whole, as
its strategy is given it to write (``_keep_saved``), and a retried attempt's ``fit()`` resumes
from the latest (``resuming``; also where the cell asks for ``ckpt_path="last"``, which a new
disk lacks), except the one Lightning writes where a stop came mid-epoch: it
marks the epoch as ended (a resume would skip the rest of it), and a plain ``DataLoader`` cannot
resume mid-epoch anyway. The retry resumes from the end of the epoch before, doing the part of
the epoch done again: no step is lost, and the run ends as one never stopped.

Lightning reads torchrun's variables, which ``backend=torch`` sets; its ``devices`` and
``num_nodes`` must make the run's ranks. ``devices=`` the ranks a host, ``num_nodes=`` the hosts
works as it is; ``devices=1, num_nodes=np`` (one process a node, as TorchDistributor's docs
write it for Spark) is made to work on one host too, each rank its own node; other numbers get a
``TrainerError`` that names the numbers to use, before Lightning's own error.
"""

from __future__ import annotations

import functools
import math
import os
from types import ModuleType
from typing import Any

from hvd_magic.errors import TrainerError
from hvd_magic.rank.checkpoints import StoppingLate
from hvd_magic.rank.distributor import RankSetup
from hvd_magic.rank.reporting import report
from hvd_magic.rank.resized import resized
from hvd_magic.rank.trainers import resuming
from hvd_magic.rank.trainers.readings import LossReading, numbers

__all__ = ["MODULES", "callback_class", "check_layout", "patch"]

# Lightning's two packages (``lightning.pytorch`` and the standalone ``pytorch_lightning``): a
# trainer of each accepts only its own package's Callback
PACKAGES = ("lightning.pytorch", "pytorch_lightning")
MODULES = tuple(f"{package}.trainer.trainer" for package in PACKAGES)


class _LightningCallbackMixin:
    """Reports a Lightning ``Trainer``'s steps, loss, learning rate and validation metrics;
    stops it gracefully."""

    def __init__(self, stoppable: bool = True) -> None:
        super().__init__()
        self.stoppable = stoppable
        self._reading = LossReading()
        self._stopping = StoppingLate()  # asked each step, answered a few steps late: no wait added
        self._total: int | None = None
        self._stopped_mid_epoch = False  # the checkpoint Lightning writes now is not one to resume from
        self.training = 1  # which of the cell's fit() calls this is (resuming.Trainings.begin)
        self._step, self._loss = 0, None  # the last step reported; the loss of the batches since

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        estimated = trainer.estimated_stepping_batches  # inf where max_epochs=-1
        finite = isinstance(estimated, (int, float)) and math.isfinite(estimated)
        self._total = int(estimated) if finite else None
        self._stopped_mid_epoch = False  # a fit() of its own (the callback may serve several)
        self._step, self._loss = trainer.global_step, None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, index: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:  # a batch's share: Lightning divides it by accumulate_grad_batches
            loss = loss.detach() if hasattr(loss, "detach") else loss
            self._loss = loss if self._loss is None else self._loss + loss
        if trainer.global_step != self._step:  # the optimizer stepped: its batches' sum is the step's loss
            self._step, (loss, self._loss) = trainer.global_step, (self._loss, None)
            metrics: dict[str, Any] = {}
            if (value := self._reading.read(loss)) is not None:
                metrics["loss"] = value
            if trainer.optimizers:
                metrics["learning_rate"] = float(trainer.optimizers[0].param_groups[0]["lr"])
            report(step=trainer.global_step, total=self._total, epoch=trainer.current_epoch, **metrics)
        if self.stoppable and self._stopping():
            trainer.should_stop = True
            self._stopped_mid_epoch = index + 1 < trainer.num_training_batches

    def keep(self, trainer: Any, checkpoint: dict[str, Any]) -> None:
        """A checkpoint Lightning saves, whole (every hook has added its part: the module's own
        comes after the callbacks'), kept by the run too (rank 0; ``resuming``); not one of the
        weights alone (nothing to resume training from), nor one written after a stop mid-epoch."""
        if trainer.global_rank == 0 and not self._stopped_mid_epoch and "optimizer_states" in checkpoint:
            resuming.TRAININGS.keep("lightning", trainer.global_step, checkpoint, self.training)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking and (found := numbers(trainer.callback_metrics)):
            report(**found)


def callback_class(package: str = "") -> type:
    """``LightningCallback`` for ``package`` (one of ``PACKAGES``; by default the one imported,
    else the one installed): a subclass of that package's ``Callback``, one class a package."""
    import importlib.util
    import sys

    chosen = package or next((p for p in PACKAGES if p in sys.modules), None)
    if not chosen:
        chosen = next((p for p in PACKAGES if importlib.util.find_spec(p.split(".")[0])), PACKAGES[0])
    return _built(chosen)


@functools.cache
def _built(package: str) -> type:
    import importlib

    base = importlib.import_module(f"{package}.callbacks").Callback
    mixin = _LightningCallbackMixin
    return type("LightningCallback", (mixin, base), {"__doc__": mixin.__doc__})


def check_layout(devices: Any, num_nodes: Any) -> tuple[Any, Any]:
    """``Trainer(devices=, num_nodes=)`` against this run's ranks (torchrun's variables), and the
    numbers to build it with: ``devices=1, num_nodes=np`` on a host of several ranks makes each
    rank its own node; in an attempt ``min_np=`` resized, the numbers written for the run make
    this attempt's (the trainer runs on the ranks it has); other numbers that do not make the run
    raise a ``TrainerError`` naming the ones to use."""
    if "WORLD_SIZE" not in os.environ or "LOCAL_WORLD_SIZE" not in os.environ:
        return devices, num_nodes  # not a torch.distributed run of ours: Lightning's own reading
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    counted = isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1
    if not counted or not isinstance(num_nodes, int):
        return devices, num_nodes  # "auto", -1, a list of devices: Lightning's own reading
    size, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    hosts = int(os.environ.get("GROUP_WORLD_SIZE", max(1, size // local)))
    resizing = resized() is not None
    uneven = resizing and local * hosts != size  # a resized attempt of 3 ranks on 2 hosts: 2 and 1
    if devices == local and num_nodes == hosts and not uneven:
        return devices, num_nodes
    if uneven or (devices == 1 and (num_nodes == size or (resizing and num_nodes > 1))):
        RankSetup(task_is_node=True).apply()  # LOCAL_RANK=0, GROUP_RANK=RANK: a node of one process
        return 1, size
    if resizing:
        return local, hosts
    ways = f"devices={local}, num_nodes={hosts}" + ("" if local == 1 else f", or devices=1, num_nodes={size}")
    raise TrainerError(
        f"Lightning's Trainer(devices={devices}, num_nodes={num_nodes}) makes {devices * num_nodes} "
        f"processes, but this run has {size} ranks ({local} on each of {hosts} host"
        f"{'s' if hosts != 1 else ''}): write {ways}, or change np"
    )


def patch(module: ModuleType) -> None:
    """Every ``Trainer`` of this package built from now on has its layout checked and a
    ``LightningCallback`` (the user's own, if given)."""
    trainer_class = module.Trainer
    if getattr(trainer_class, "_hvd_magic_watched", False):
        return
    package, init = module.__name__.removesuffix(".trainer.trainer"), trainer_class.__init__

    @functools.wraps(init)
    def init_watched(self: Any, *args: Any, **kwargs: Any) -> None:
        devices, num_nodes = check_layout(kwargs.get("devices", "auto"), kwargs.get("num_nodes", 1))
        if (devices, num_nodes) != (kwargs.get("devices", "auto"), kwargs.get("num_nodes", 1)):
            kwargs = {**kwargs, "devices": devices, "num_nodes": num_nodes}  # this attempt's layout
        mine = callback_class(package)  # built at the first Trainer: the package is imported by then
        given = kwargs.get("callbacks")
        callbacks = [] if given is None else list(given) if isinstance(given, list) else [given]
        if not any(isinstance(c, mine) for c in callbacks):
            callbacks.append(mine())
        init(self, *args, **{**kwargs, "callbacks": callbacks})

    fit = trainer_class.fit

    @functools.wraps(fit)
    def fit_resumed(self: Any, *args: Any, **kwargs: Any) -> Any:
        mine = [callback for callback in self.callbacks if isinstance(callback, _LightningCallbackMixin)]
        training = resuming.TRAININGS.begin("lightning", mine)
        if mine and resuming.keeping():
            _keep_saved(self, mine[0])
        given = kwargs.get("ckpt_path")  # "last": this host's last, where there is one
        if (given is None or given == "last") and len(args) < 5:  # ckpt_path is the fifth
            kwargs["ckpt_path"] = _kept_checkpoint(training) or given
        return fit(self, *args, **kwargs)

    trainer_class.__init__ = init_watched
    trainer_class.fit = fit_resumed
    trainer_class._hvd_magic_watched = True


def _kept_checkpoint(training: int) -> str | None:
    """The run's copy of the ``training``-th ``fit()``'s latest checkpoint, saved as a file of
    this rank's own, in a retried attempt (not held on to while the trainer trains: its tensors
    may be a GPU's)."""
    found = resuming.TRAININGS.kept("lightning", training)
    if found is None:
        return None
    import torch

    path = os.path.join(resuming.private_folder(), f"step-{found[0]}.ckpt")
    torch.save(found[1], path)
    return path


def _keep_saved(trainer: Any, callback: _LightningCallbackMixin) -> None:
    """Each checkpoint ``trainer`` saves given to ``callback.keep`` as its strategy writes it."""
    strategy = trainer.strategy
    if getattr(strategy, "_hvd_magic_keeps", False):
        return
    save = strategy.save_checkpoint

    @functools.wraps(save)
    def save_kept(checkpoint: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        callback.keep(trainer, checkpoint)
        return save(checkpoint, *args, **kwargs)

    strategy.save_checkpoint = save_kept
    strategy._hvd_magic_keeps = True
