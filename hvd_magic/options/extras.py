"""The optional packages the sinks write with, imported only when a run asks for them; when one
is missing, an ImportError that names the install."""

from __future__ import annotations

from typing import Any

__all__ = ["MLFLOW_INSTALL", "TENSORBOARD_INSTALL", "mlflow_module", "tensorboard_record_writer"]

TENSORBOARD_INSTALL = "pip install hvd_magic[tensorboard] (or pip install tensorboard)"
MLFLOW_INSTALL = "pip install hvd_magic[mlflow] (or pip install mlflow)"


def tensorboard_record_writer() -> Any:
    """TensorBoard's record writer (event files are written with it and TensorBoard's protos)."""
    try:
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError as err:
        raise ImportError(
            f"writing TensorBoard event files needs the tensorboard package: {TENSORBOARD_INSTALL}"
        ) from err
    return RecordWriter


def mlflow_module() -> Any:
    try:
        import mlflow
    except ImportError as err:
        raise ImportError(f"logging to MLflow needs the mlflow package: {MLFLOW_INSTALL}") from err
    return mlflow
