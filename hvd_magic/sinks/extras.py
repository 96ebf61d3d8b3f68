"""The optional packages the sinks write with, imported only when a run asks for them; when one
is missing, an ImportError that names the install."""

from __future__ import annotations

from typing import Any

__all__ = ["MLFLOW_INSTALL", "TENSORBOARD_INSTALL", "mlflow_module", "tensorboard_writer"]

TENSORBOARD_INSTALL = "pip install hvd_magic[tensorboard] (or pip install tensorboard)"
MLFLOW_INSTALL = "pip install hvd_magic[mlflow] (or pip install mlflow)"


def tensorboard_writer() -> Any:
    """``tensorboard.summary.Writer``: TensorBoard's own, framework-free writer."""
    try:
        from tensorboard.summary import Writer
    except ImportError as err:
        raise ImportError(
            f"writing TensorBoard event files needs the tensorboard package: {TENSORBOARD_INSTALL}"
        ) from err
    return Writer


def mlflow_module() -> Any:
    try:
        import mlflow
    except ImportError as err:
        raise ImportError(f"logging to MLflow needs the mlflow package: {MLFLOW_INSTALL}") from err
    return mlflow
