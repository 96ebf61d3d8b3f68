"""Spark ML estimators that train with Horovod, for people leaving horovod.spark's estimators
(which need Petastorm and pyarrow<11): change the import, keep the arguments.

    estimator        HorovodEstimator / HorovodModel: fit = one run with data=df; transform
                     with predict_batch_udf; persistence (estimator_io: before fit)
    torch_estimator  TorchEstimator / TorchModel       (torch_training: on the ranks)
    keras_estimator  KerasEstimator / KerasModel       (keras_training, keras_metrics, keras_io)
    compat, compat_params  horovod.spark's arguments: backend, store, run_id ... and the unused
    params, columns, training, epoch_metrics, callback_files, persistence: what they share
    fit_records      a fit's TensorBoard files (model_dir/logs) and MLflow params and model
"""

from __future__ import annotations

from typing import Any

__all__ = ["HorovodEstimator", "HorovodModel", "KerasEstimator", "KerasModel", "TorchEstimator", "TorchModel"]

_WHERE = {
    "HorovodEstimator": "estimator",
    "HorovodModel": "estimator",
    "KerasEstimator": "keras_estimator",
    "KerasModel": "keras_estimator",
    "TorchEstimator": "torch_estimator",
    "TorchModel": "torch_estimator",
}


def __getattr__(name: str) -> Any:
    # pyspark.ml loads only when an estimator is asked for.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'hvd_magic.spark' has no attribute {name!r}")
