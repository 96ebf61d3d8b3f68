"""KerasEstimator on the ranks: a Keras 3 model (TensorFlow backend) trained with Horovod's
TensorFlow ops (gradients averaged by a grouped allreduce; Horovod's own Keras binding needs
the legacy tf-keras, the notebook's model is Keras 3), Keras' callbacks called as ``fit`` calls
them (their files sent to ``model_dir``), metrics on the training batches and the validation
rows as Keras reports them, resumed from the latest checkpoint and checkpointed each epoch
(``hvd_magic.resume`` / ``checkpoint``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import cloudpickle

from hvd_magic.rank.checkpoints import checkpoint, resume
from hvd_magic.rank.collective_tf import timed
from hvd_magic.spark.callback_files import RankFolder
from hvd_magic.spark.epoch_metrics import Averages
from hvd_magic.spark.keras_io import as_model_input, input_shapes, load_model, reduced_loss
from hvd_magic.spark.keras_metrics import Meters, metric_names
from hvd_magic.spark.training import (
    Rows,
    TrainSpec,
    batches,
    end_of_batch,
    end_of_epoch,
    load_rows,
    steps_per_epoch,
    validation_batches,
)

__all__ = ["train"]


def train(spec: TrainSpec) -> dict[str, Any]:
    """Runs on every rank; rank 0's value (weights, history) is the fit's result."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    hvd.init()
    if spec.hide_gpus:  # use_gpu=False
        tf.config.set_visible_devices([], "GPU")
    keras.utils.set_random_seed(spec.seed)
    trainer = Trainer(spec, load_rows(spec))
    folder = RankFolder(spec.callbacks, hvd.rank()) if spec.send_files else None
    try:
        history = trainer.fit(folder)
    finally:
        if folder is not None:
            folder.close()
    weights = cloudpickle.dumps(trainer.model.get_weights())
    return {"weights": weights, "history": history, "width": int(trainer.rows.x.shape[1])}


class Trainer:
    """The model, its step and what an epoch needs, built the same way on every rank."""

    def __init__(self, spec: TrainSpec, rows: Rows) -> None:
        import horovod.tensorflow as hvd
        import keras

        self.spec, self.rows, self.rank = spec, rows, hvd.rank()
        self.model = load_model(spec.model, spec.custom_objects)
        optimizer = keras.optimizers.deserialize(spec.optimizer, custom_objects=spec.custom_objects)
        optimizer.build(self.model.trainable_variables)
        self.loss = reduced_loss(spec.loss, spec.custom_objects)
        self.start, self.history = 0, []
        state = resume()  # this fit's latest (a retry), or an earlier fit's in model_dir
        if state is not None:
            self.model.set_weights(state["weights"])
            self.start, self.history = int(state["epoch"]), list(state["history"])
        for index, variable in enumerate(self.model.weights):
            variable.assign(hvd.broadcast(variable.value, root_rank=0, name=f"weight.{index}"))
        self.step = _step_function(self.model, optimizer, self.loss, spec.compression)
        self.model.compile(optimizer=optimizer, loss=self.loss)  # callbacks reach it as model.optimizer
        self.shapes = input_shapes(self.model)
        self.steps = steps_per_epoch(spec, int(_sum([len(rows.x)], "train.rows")[0]), hvd.size())
        self.validating = isinstance(spec.validation, str) or spec.validation > 0

    def fit(self, folder: RankFolder | None) -> list[dict[str, float]]:
        import keras

        spec = self.spec
        saved = self._checkpoint_callback()
        logs = _epoch_logs()  # last, where Keras puts its History: it sees what the others added
        callbacks = keras.callbacks.CallbackList(
            [*spec.callbacks, *([saved] if saved else []), logs],
            model=self.model,
            epochs=spec.epochs,
            steps=self.steps,
            verbose=spec.verbose,
        )
        callbacks.on_train_begin()
        for epoch in range(self.start + 1, spec.epochs + 1):
            callbacks.on_epoch_begin(epoch - 1)
            callbacks.on_epoch_end(
                epoch - 1, self._epoch(epoch, callbacks)
            )  # as in Keras, they may add to the logs
            self.history.append(_numbers(logs.last))
            end_of_epoch(epoch, self.steps, self.history[-1], spec.verbose, self.rank)
            if self.rank == 0 and spec.save_checkpoints:
                state = {"epoch": epoch, "history": self.history, "weights": self.model.get_weights()}
                checkpoint(state, step=epoch)
            if folder is not None:
                folder.send()
            if _stop_agreed(self.model):
                break
        callbacks.on_train_end(self.history[-1] if self.history else {})
        if saved is not None and os.path.exists(saved.filepath):
            self.model.load_weights(saved.filepath)  # the model it kept (e.g. the best), as horovod.spark
        if saved is not None and not spec.send_files:
            shutil.rmtree(os.path.dirname(saved.filepath), ignore_errors=True)  # its temporary folder
        return self.history

    def _checkpoint_callback(self) -> Any:
        """``checkpoint_callback`` on rank 0, writing into the rank's folder (as horovod.spark
        pointed it at its run's checkpoint file); None elsewhere."""
        saved = self.spec.extra.get("checkpoint_callback")
        if saved is None or self.rank != 0:
            return None
        name = "checkpoint.weights.h5" if getattr(saved, "save_weights_only", False) else "checkpoint.keras"
        folder = os.getcwd() if self.spec.send_files else tempfile.mkdtemp(prefix="hvd_magic-checkpoint-")
        saved.filepath = os.path.join(folder, name)
        return saved

    def _epoch(self, epoch: int, callbacks: Any) -> dict[str, float]:
        spec, rows = self.spec, self.rows
        averages = Averages(
            ["loss", *metric_names(spec, "")]
            + (["val_loss", *metric_names(spec, "val_")] if self.validating else [])
        )
        meters = Meters(spec, "", averages)
        order = batches(len(rows.x), spec.batch_size, spec.seed, epoch, self.rank, spec.shuffle, self.steps)
        for number, index in enumerate(order):
            callbacks.on_train_batch_begin(number)
            value, output = self.step(as_model_input(rows.x[index], self.shapes), rows.y[index])
            averages.add("loss", float(value), len(index))
            meters.update(rows.y[index], output)
            callbacks.on_train_batch_end(number, {"loss": float(value)})
            end_of_batch(self.spec, epoch, number, self.steps, float(value))
        meters.finish()
        if self.validating:
            self._evaluate(averages)
        return averages.reduce(lambda sums: _sum(sums, "epoch.metrics"))

    def _evaluate(self, averages: Averages) -> None:
        spec, rows = self.spec, self.rows
        meters = Meters(spec, "val_", averages)
        for part in validation_batches(
            len(rows.val_x), spec.val_batch_size or spec.batch_size, spec.val_steps
        ):
            output = self.model(as_model_input(rows.val_x[part], self.shapes), training=False)
            averages.add("val_loss", float(self.loss(rows.val_y[part], output)), len(rows.val_y[part]))
            meters.update(rows.val_y[part], output)
        meters.finish()


def _epoch_logs() -> Any:
    """A Keras callback keeping the last epoch's logs in ``last``."""
    import keras

    class EpochLogs(keras.callbacks.Callback):  # type: ignore[misc]
        last: dict[str, Any] = {}

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.last = dict(logs or {})

    return EpochLogs()


def _numbers(logs: dict[str, Any]) -> dict[str, float]:
    """The logs that are numbers (what the history and the live view keep)."""
    kept = {}
    for name, value in logs.items():
        with contextlib.suppress(TypeError, ValueError):
            kept[name] = float(value)
    return kept


def _stop_agreed(model: Any) -> bool:
    """A callback asked to stop (``model.stop_training``, e.g. EarlyStopping) on any rank: all
    ranks stop after this epoch, together (a rank going on alone would wait forever)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    asked = tf.constant(1.0 if model.stop_training else 0.0, tf.float64)
    stop = float(hvd.allreduce(asked, op=hvd.Max, name="epoch.stop").numpy()) > 0
    model.stop_training = stop
    return stop


def _sum(values: Any, name: str) -> Any:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name=name).numpy()


def _step_function(model: Any, optimizer: Any, loss: Any, compression: Any) -> Callable[[Any, Any], Any]:
    """One training step as a graph, giving the loss and the outputs: gradients averaged over
    the ranks (grouped allreduce: Horovod's DistributedGradientTape needs tf.Variables, Keras 3
    has its own)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    compressed = {"compression": compression} if compression is not None else {}

    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            output = model(x, training=True)
            value = loss(y, output)
        gradients = tape.gradient(value, model.trainable_variables)
        gradients = timed(hvd.grouped_allreduce)(gradients, op=hvd.Average, **compressed)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return value, output

    return tf.function(step, autograph=False)  # type: ignore[no-any-return]
