"""``KerasEstimator`` / ``KerasModel``: horovod.spark's Keras estimator for Keras 3 models.

>>> est = KerasEstimator(num_proc=2, model=model, optimizer=keras.optimizers.Adam(1e-3),
...                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
...                      feature_cols=["features"], label_cols=["label"], epochs=3)  # doctest: +SKIP
>>> est.fit(train_df).transform(test_df)        # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import cloudpickle
from pyspark.ml.param import Param, Params

from hvd_magic.spark.compat_params import UNUSED
from hvd_magic.spark.estimator import HorovodEstimator, HorovodModel
from hvd_magic.spark.params import accessors
from hvd_magic.spark.training import TrainSpec, is_accuracy

__all__ = ["KerasEstimator", "KerasModel"]

CUSTOM_OBJECTS = "custom_objects.pkl"


class KerasModel(HorovodModel):
    """A fitted Keras model (``model.keras_model``); transforms on the executors."""

    def __init__(self, history: list[dict[str, float]] | None = None, feature_width: int = 0) -> None:
        super().__init__(history, feature_width)
        self.keras_model: Any = None
        self.custom_objects: dict[str, Any] = {}  # what the model's file needs to load

    def getModel(self) -> Any:  # noqa: N802 - horovod.spark's name
        """The fitted Keras model (as horovod.spark's ``KerasModel.getModel()``)."""
        return self.keras_model

    def make_predict_fn(self) -> Callable[[], Callable[[Any], Any]]:
        from hvd_magic.spark.keras_io import make_predictor, model_bytes

        blob = model_bytes(self.keras_model)
        return functools.partial(make_predictor, blob, cloudpickle.dumps(self.custom_objects))

    def save_artifacts(self, folder: str) -> None:
        self.keras_model.save(os.path.join(folder, "model.keras"))
        if self.custom_objects:  # by value when they were defined in the notebook
            with open(os.path.join(folder, CUSTOM_OBJECTS), "wb") as out:
                cloudpickle.dump(self.custom_objects, out)

    def load_artifacts(self, folder: str) -> None:
        import keras

        if os.path.exists(os.path.join(folder, CUSTOM_OBJECTS)):
            with open(os.path.join(folder, CUSTOM_OBJECTS), "rb") as blob:
                self.custom_objects = cloudpickle.load(blob)
        path = os.path.join(folder, "model.keras")
        self.keras_model = keras.saving.load_model(path, compile=False, custom_objects=self.custom_objects)


@accessors
class KerasEstimator(HorovodEstimator):
    """Trains a Keras 3 model with Horovod on ``num_proc`` ranks: ``fit(df)`` gives a
    ``KerasModel``. ``optimizer`` is a Keras optimizer (its config travels), ``loss`` a name or
    a Keras loss. ``callbacks`` are called on every rank as Keras' ``fit`` calls them (train,
    epoch and batch hooks; ``model.optimizer`` is the optimizer that trains), with the epoch's
    metrics averaged over the ranks; what they add to the epoch's logs (e.g. the learning rate)
    goes into ``history``. A stop asked on any rank (``model.stop_training``, as EarlyStopping
    does) ends training after that epoch on all of them. Features in one flat column are reshaped
    to the model's input shape (e.g. 784 values to (28, 28, 1)), as horovod.spark did."""

    checkpoint_callback: Param[Any] = Param(
        Params._dummy(),
        "checkpoint_callback",
        "a ModelCheckpoint run on rank 0 into model_dir (checkpoint.keras); the fitted model is the one "
        "it kept",
    )
    backend_env: Param[Any] = Param(Params._dummy(), "backend_env", "environment variables for the ranks")
    framework = "keras"
    calls_callbacks = True
    unused_here = UNUSED | {
        "backward_passes_per_step": (
            1,
            "KerasEstimator does not accumulate gradients (nor did horovod.spark's)",
        ),
        "input_shapes": (None, "KerasEstimator reshapes the features to the model's own input shape"),
    }
    _restored: tuple[Any, dict[str, Any]]  # this fit's model, loaded back from its file, and what that took

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self._setDefault(checkpoint_callback=None, backend_env=None)
        self.setParams(**params)

    def train_function(self) -> Callable[[TrainSpec], Any]:
        from hvd_magic.spark.keras_training import train

        return train

    def train_spec(self) -> TrainSpec:
        import keras

        from hvd_magic.spark.keras_io import load_model, model_bytes

        self.require("model", "loss")
        model = self.getOrDefault("model")
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"KerasEstimator takes a Keras 3 model (keras.Model), got {type(model).__module__}."
                f"{type(model).__qualname__}; build it with `import keras` (here tf.keras may be tf-keras)."
            )
        given = self.getOrDefault("optimizer") if self.isDefined("optimizer") else None
        if given is None and getattr(model, "optimizer", None) is None:
            raise ValueError(
                "KerasEstimator needs optimizer= (or a model compiled with one, as horovod.spark)"
            )
        optimizer = keras.optimizers.serialize(given if given is not None else model.optimizer)
        blob, custom = model_bytes(model), self.custom_objects_of(model)
        try:  # here, as it will on the ranks: with what custom holds, from the notebook's code
            self._restored = load_model(blob, custom), custom  # make_model's starting point
        except Exception as err:  # noqa: BLE001 - Keras says what it could not find in many ways
            said = " ".join(str(err).split())[:300]
            raise ValueError(
                f"KerasEstimator: the model does not load back from its .keras file with "
                f"{sorted(custom) or 'no custom objects'} ({type(err).__name__}: {said}). "
                "Give the functions and classes of your own it uses as custom_objects={'name': object}."
            ) from None
        spec = self.common_spec(blob, optimizer, self.getOrDefault("loss"))
        spec.custom_objects = custom
        spec.extra = {"checkpoint_callback": self.getOrDefault("checkpoint_callback")}
        return spec

    def custom_objects_of(self, model: Any) -> dict[str, Any]:
        """What the ranks' Keras needs beyond its own: the model's classes and the metrics' (found),
        what was registered with Keras in the notebook, and the ``custom_objects`` given."""
        import keras

        from hvd_magic.spark.keras_io import custom_classes

        found = custom_classes(model)
        for metric in self.getOrDefault("metrics"):
            if isinstance(metric, keras.metrics.Metric) and not type(metric).__module__.startswith("keras."):
                found[keras.saving.get_registered_name(type(metric))] = type(metric)
        registered = keras.saving.get_custom_objects().items()
        found |= {name: item for name, item in registered if getattr(item, "__module__", "") == "__main__"}
        return found | dict(self.getOrDefault("custom_objects"))

    def check_metric(self, metric: Any) -> Any:
        """Keras metric names ('mae', 'sparse_categorical_accuracy') and Metric objects too; an
        object travels as its config (a fresh one on every rank)."""
        import keras

        if isinstance(metric, keras.metrics.Metric):
            return keras.metrics.serialize(metric)
        if isinstance(metric, str) and not is_accuracy(metric):
            try:
                keras.metrics.get(metric)
            except ValueError:
                raise ValueError(f"KerasEstimator: Keras has no metric named {metric!r}") from None
            return metric
        return super().check_metric(metric)

    def make_model(self, result: Any, feature_width: int) -> HorovodModel:
        fitted = KerasModel(result["history"], feature_width)
        fitted.keras_model, fitted.custom_objects = self._restored  # loaded back by train_spec
        fitted.keras_model.set_weights(cloudpickle.loads(result["weights"]))
        return fitted
