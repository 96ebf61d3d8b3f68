"""What a fit leaves besides the live view, as horovod.spark's estimators did: TensorBoard event
files in ``model_dir/logs`` by default (when tensorboard is installed: the sinks say), and with
an MLflow run active in the notebook, the estimator's params and the fitted model's folder.
The run's own sinks write both (``options.logdir``, ``options.params``); only the model's folder
is logged here, once it is saved."""

from __future__ import annotations

from typing import Any

from hvd_magic.options import RunOptions
from hvd_magic.sinks import model_dir_logdir
from hvd_magic.sinks.mlflow import log_model

__all__ = ["after_fit", "before_fit", "estimator_params"]


def before_fit(estimator: Any, options: RunOptions, folder: str | None) -> None:
    """The fit's event files into ``folder/logs`` (unless a logdir is set), its params for MLflow."""
    options.logdir = options.logdir or model_dir_logdir(folder)
    options.params = {**estimator_params(estimator), **options.params}


def estimator_params(estimator: Any) -> dict[str, Any]:
    """Every parameter that has a value (given or default), by name."""
    return {
        param.name: estimator.getOrDefault(param.name)
        for param in estimator.params
        if estimator.isDefined(param.name)
    }


def after_fit(model: Any, saved: str | None) -> None:
    """The fitted model's folder (``saved``: where the fit wrote it; else written for this)
    into the notebook's active MLflow run; nothing without one."""
    log_model(model, saved)
