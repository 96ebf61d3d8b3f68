"""KerasEstimator's metrics on a rank, as Keras reports them: each metric on the training batches
(``accuracy``) and, with validation, on the validation rows (``val_accuracy``). A metric is
``'accuracy'`` (the largest output's index, or a one-value output of at least 0.5), a name Keras
knows (logged as given, as ``compile`` logs it: ``'mse'``, not ``'mean_squared_error'``), a
Keras ``Metric`` (its config: a fresh one each epoch) or a function of (target, output)."""

from __future__ import annotations

from typing import Any

from hvd_magic.spark.epoch_metrics import Averages
from hvd_magic.spark.training import TrainSpec, accuracy, is_accuracy

__all__ = ["Meters", "metric_names"]


def _name(metric: Any) -> str:
    if isinstance(metric, dict):  # a Metric's config
        return str(metric.get("config", {}).get("name") or metric.get("class_name", "metric"))
    if isinstance(metric, str):
        return metric
    return getattr(metric, "__name__", "metric")


def metric_names(spec: TrainSpec, prefix: str) -> list[str]:
    return [prefix + _name(metric) for metric in spec.metrics]


def _accuracy(target: Any, output: Any) -> float:
    return accuracy(output, target)


def _resolve(metric: Any, custom_objects: dict[str, Any]) -> Any:
    import keras

    if is_accuracy(metric):
        return _accuracy
    if isinstance(metric, dict):
        return keras.metrics.deserialize(metric, custom_objects=custom_objects)
    if isinstance(metric, str):
        return keras.metrics.get(metric)
    return metric


class Meters:
    """One phase's metrics: functions add each batch's mean to ``averages``; Metric objects
    accumulate and add their result once, at ``finish``."""

    def __init__(self, spec: TrainSpec, prefix: str, averages: Averages) -> None:
        self.averages, self.rows = averages, 0
        self.items = [
            (prefix + _name(metric), _resolve(metric, spec.custom_objects)) for metric in spec.metrics
        ]
        for _, metric in self.items:
            if hasattr(metric, "reset_state"):  # a Metric object Keras gave for a name: last epoch's state
                metric.reset_state()

    def update(self, target: Any, output: Any) -> None:
        import keras
        import numpy

        self.rows += len(target)
        for name, metric in self.items:
            if isinstance(metric, keras.metrics.Metric):
                metric.update_state(target, output)
            else:
                self.averages.add(name, float(numpy.mean(metric(target, output))), len(target))

    def finish(self) -> None:
        import keras

        for name, metric in self.items:
            if isinstance(metric, keras.metrics.Metric):
                self.averages.add(name, float(metric.result()), self.rows)
