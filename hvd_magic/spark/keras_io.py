"""Keras models for KerasEstimator, wherever they are: as the bytes of a ``.keras`` file (to the
ranks and executors), their own classes (which the file names), the shape of their inputs
(flat feature rows are reshaped to it, as horovod.spark did), a loss reduced as Keras'
``compile`` reduces one, and the predict function ``transform`` uses."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import cloudpickle

from hvd_magic.spark.columns import model_inputs

__all__ = ["custom_classes", "input_shapes", "load_model", "make_predictor", "model_bytes", "reduced_loss"]


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


def input_shapes(model: Any) -> list[list[int]] | None:
    """Each input's shape, batch first (-1); None when one has a free dimension besides the
    batch (the rows then go in as they are)."""
    shapes = []
    for tensor in model.inputs:
        dims = list(tensor.shape)[1:]
        if any(dim is None for dim in dims):
            return None
        shapes.append([-1, *(int(dim) for dim in dims)])
    return shapes


def as_model_input(x: Any, shapes: list[list[int]] | None) -> Any:
    """Flat feature rows as the model takes them: one array, or a list for several inputs."""
    parts = model_inputs(x, shapes)
    return parts[0] if len(parts) == 1 else parts


def reduced_loss(loss: Any, custom_objects: dict[str, Any]) -> Any:
    """A Keras ``Loss``: a name or config through Keras; a plain function of (target, output)
    giving a value a row (``keras.losses.sparse_categorical_crossentropy``) wrapped to average
    them, as ``compile`` wraps one; a single-output regression's (rows,) target to (rows, 1)."""
    import keras

    if isinstance(loss, dict):
        loss = keras.losses.deserialize(loss, custom_objects=custom_objects)
    elif isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        return loss

    class FunctionLoss(keras.losses.Loss):  # type: ignore[misc]
        def call(self, target: Any, output: Any) -> Any:
            if len(target.shape) == len(output.shape) - 1 and output.shape[-1] == 1:
                target = keras.ops.expand_dims(target, -1)
            return loss(target, output)

    return FunctionLoss(name=getattr(loss, "__name__", "loss"))


def make_predictor(blob: bytes, custom_objects: bytes) -> Callable[[Any], Any]:
    """For ``predict_batch_udf``: load the model once per Python worker, predict in batches."""
    import numpy

    model = load_model(blob, cloudpickle.loads(custom_objects))
    shapes = input_shapes(model)

    def predict(inputs: Any) -> Any:
        flat = numpy.asarray(inputs, dtype=numpy.float32)
        output = numpy.asarray(model(as_model_input(flat, shapes), training=False))
        return output.reshape(len(inputs), -1)

    return predict
