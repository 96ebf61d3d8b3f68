"""KerasEstimator on the ranks: a Keras 3 model (TensorFlow backend) trained with Horovod's
TensorFlow ops (gradients averaged by a grouped allreduce; Horovod's own Keras binding
needs the legacy tf-keras, the notebook's model is Keras 3), a checkpoint per epoch from rank 0, and (on the
executors) the predict function ``transform`` uses."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

import cloudpickle

from .. import reporting
from .training import (
    Rows,
    TrainSpec,
    accuracy,
    batches,
    checkpoint_name,
    end_of_epoch,
    is_accuracy,
    load_rows,
)

__all__ = ["custom_classes", "load_model", "make_predictor", "model_bytes", "train"]


def model_bytes(model: Any) -> bytes:
    """A Keras model as the bytes of its ``.keras`` file (architecture, weights, compile)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        with open(path, "rb") as saved:
            return saved.read()


def load_model(blob: bytes, custom_objects: dict[str, Any] | None = None) -> Any:
    import keras

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as out:
            out.write(blob)
        return keras.saving.load_model(path, compile=False, custom_objects=custom_objects)


def custom_classes(model: Any) -> dict[str, Any]:
    """The classes of the model and its layers (nested ones too) that are not Keras' own, by
    the name its file gives them: a process without the notebook's code needs them to load it."""
    import keras

    found, stack = {}, [model]
    while stack:
        layer = stack.pop()
        if not type(layer).__module__.startswith("keras."):
            found[keras.saving.get_registered_name(type(layer))] = type(layer)
        stack.extend(getattr(layer, "layers", []))
    return found


def train(spec: TrainSpec) -> dict[str, Any]:
    """Runs on every rank; rank 0's value (weights, history) is the fit's result."""
    import horovod.tensorflow as hvd
    import keras

    hvd.init()
    keras.utils.set_random_seed(spec.seed)
    rows = load_rows(spec)
    model = load_model(spec.model, spec.custom_objects)
    optimizer = keras.optimizers.deserialize(spec.optimizer, custom_objects=spec.custom_objects)
    optimizer.build(model.trainable_variables)
    loss = keras.losses.get(spec.loss) if isinstance(spec.loss, (str, dict)) else spec.loss
    start, history = 0, []
    if spec.checkpoint is not None:
        state = cloudpickle.loads(spec.checkpoint)
        model.set_weights(state["weights"])
        start, history = int(state["epoch"]), list(state["history"])
    for index, variable in enumerate(model.weights):
        variable.assign(hvd.broadcast(variable.value, root_rank=0, name=f"weight.{index}"))
    step = _step_function(model, optimizer, loss)
    model.compile(optimizer=optimizer, loss=loss)  # callbacks reach it as model.optimizer (LR schedules)
    steps = -(-len(rows.x) // spec.batch_size)
    logs = _epoch_logs()  # last, where Keras puts its History: it sees what the others added
    callbacks = keras.callbacks.CallbackList(
        [*spec.callbacks, logs], model=model, epochs=spec.epochs, steps=steps, verbose=spec.verbose
    )
    callbacks.on_train_begin()
    for epoch in range(start + 1, spec.epochs + 1):
        callbacks.on_epoch_begin(epoch - 1)
        metrics = {"loss": _train_epoch(spec, step, rows, epoch, callbacks)}
        if len(rows.val_x):
            metrics |= _evaluate(spec, model, loss, rows)
        metrics = {name: _average(hvd, name, value) for name, value in metrics.items()}
        callbacks.on_epoch_end(epoch - 1, metrics)  # as in Keras, they may add to the logs
        metrics = _numbers(logs.last)
        history.append(metrics)
        end_of_epoch(epoch, metrics, spec.verbose, hvd.rank())
        if hvd.rank() == 0 and spec.save_checkpoints:
            state = {"epoch": epoch, "history": history, "weights": model.get_weights()}
            reporting.send_file(checkpoint_name(epoch) + ".pkl", cloudpickle.dumps(state))
        if _stop_agreed(hvd, model):
            break
    callbacks.on_train_end(history[-1] if history else {})
    weights = cloudpickle.dumps(model.get_weights())
    return {"weights": weights, "history": history, "width": int(rows.x.shape[1])}


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


def _stop_agreed(hvd: Any, model: Any) -> bool:
    """A callback asked to stop (``model.stop_training``, e.g. EarlyStopping) on any rank: all
    ranks stop after this epoch, together (a rank going on alone would wait forever)."""
    import tensorflow as tf

    asked = tf.constant(1.0 if model.stop_training else 0.0, tf.float64)
    stop = float(hvd.allreduce(asked, op=hvd.Max, name="epoch.stop").numpy()) > 0
    model.stop_training = stop
    return stop


def _average(hvd: Any, name: str, value: float) -> float:
    import tensorflow as tf

    return float(hvd.allreduce(tf.constant(value, tf.float64), name=f"epoch.{name}").numpy())


def _step_function(model: Any, optimizer: Any, loss: Any) -> Callable[[Any, Any], Any]:
    """One training step as a graph: gradients averaged over the ranks (grouped allreduce:
    Horovod's DistributedGradientTape needs tf.Variables, Keras 3 has its own)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        gradients = hvd.grouped_allreduce(tape.gradient(value, model.trainable_variables), op=hvd.Average)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return value

    return tf.function(step, autograph=False)  # type: ignore[no-any-return]


def _train_epoch(
    spec: TrainSpec, step: Callable[[Any, Any], Any], rows: Rows, epoch: int, callbacks: Any
) -> float:
    import horovod.tensorflow as hvd

    order = list(batches(len(rows.x), spec.batch_size, spec.seed, epoch, hvd.rank(), spec.shuffle))
    total = 0.0
    for number, index in enumerate(order, 1):
        callbacks.on_train_batch_begin(number - 1)
        value = float(step(rows.x[index], rows.y[index]).numpy())
        total += value
        callbacks.on_train_batch_end(number - 1, {"loss": value})
        reporting.report(step=number, total=len(order), epoch=epoch, loss=value)
    return total / max(len(order), 1)


def _evaluate(spec: TrainSpec, model: Any, loss: Any, rows: Rows) -> dict[str, float]:
    import numpy

    output = model(rows.val_x, training=False)
    found = {"val_loss": float(numpy.mean(loss(rows.val_y, output)))}
    for metric in spec.metrics:
        if is_accuracy(metric):
            found[f"val_{metric}"] = accuracy(numpy.asarray(output), rows.val_y)
        else:
            name, value = _keras_metric(metric, rows.val_y, output, spec.custom_objects)
            found[f"val_{name}"] = value
    return found


def _keras_metric(metric: Any, target: Any, output: Any, custom_objects: dict[str, Any]) -> tuple[str, float]:
    """A metric's name and value: a Keras Metric (its config), a name Keras knows (logged as
    given, as Keras' compile does: 'mse', not 'mean_squared_error') or a function of (target,
    output)."""
    import keras
    import numpy

    name = metric if isinstance(metric, str) else getattr(metric, "__name__", "metric")
    if isinstance(metric, dict):
        metric = keras.metrics.deserialize(metric, custom_objects=custom_objects)
        name = str(metric.name)
    elif isinstance(metric, str):
        metric = keras.metrics.get(metric)
    if isinstance(metric, keras.metrics.Metric):
        metric.reset_state()
        metric.update_state(target, output)
        return name, float(metric.result())
    return name, float(numpy.mean(metric(target, output)))


def make_predictor(blob: bytes, custom_objects: bytes) -> Callable[[Any], Any]:
    """For ``predict_batch_udf``: load the model once per Python worker, predict in batches."""
    import numpy

    model = load_model(blob, cloudpickle.loads(custom_objects))

    def predict(inputs: Any) -> Any:
        output = numpy.asarray(model(numpy.asarray(inputs, dtype=numpy.float32), training=False))
        return output.reshape(len(inputs), -1)

    return predict
