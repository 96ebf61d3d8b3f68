"""What the estimators' training loops share on the ranks: the rank's rows as numpy arrays, the
validation hold-out, each epoch's order, and the per-epoch report and checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from .. import reporting
from .columns import feature_array, label_array

__all__ = [
    "Rows",
    "TrainSpec",
    "accuracy",
    "is_accuracy",
    "batches",
    "checkpoint_name",
    "end_of_epoch",
    "load_rows",
]


@dataclass
class TrainSpec:
    """Everything a rank needs to train; pickled into the run's payload by the estimator."""

    model: Any
    optimizer: Any
    loss: Any
    metrics: list[Any]
    feature_cols: list[str]
    label_cols: list[str]
    batch_size: int
    epochs: int
    validation: float
    seed: int
    shuffle: bool
    verbose: int
    checkpoint: bytes | None = None  # the latest checkpoint in model_dir: training resumes from it
    save_checkpoints: bool = True  # rank 0 sends one per epoch (only when there is a model_dir)
    callbacks: list[Any] = field(default_factory=list)
    custom_objects: dict[str, Any] = field(default_factory=dict)  # Keras: what its model's file names


@dataclass
class Rows:
    x: Any
    y: Any
    val_x: Any
    val_y: Any


def load_rows(spec: TrainSpec) -> Rows:
    """This rank's shard as numpy arrays; the last ``validation`` share held out (every rank
    holds as many rows, so every rank takes as many steps)."""
    from ..data import shard

    table = shard("arrow")
    x, y = feature_array(table, spec.feature_cols), label_array(table, spec.label_cols)
    held = int(round(len(x) * spec.validation))
    cut = len(x) - held
    return Rows(x[:cut], y[:cut], x[cut:], y[cut:])


def batches(rows: int, batch_size: int, seed: int, epoch: int, rank: int, shuffle: bool) -> Iterator[Any]:
    """Index arrays of each batch of one epoch: a new order per epoch (and per rank)."""
    import numpy

    order = numpy.arange(rows)
    if shuffle:
        numpy.random.default_rng([seed, epoch, rank]).shuffle(order)
    for start in range(0, rows, batch_size):
        yield order[start : start + batch_size]


def is_accuracy(metric: Any) -> bool:
    """The metric named 'accuracy' (or Keras' 'acc'); a metric object is never equal to it."""
    return isinstance(metric, str) and metric in ("accuracy", "acc")


def accuracy(output: Any, target: Any) -> float:
    """The share of rows whose predicted class is the label: the largest output's index, or
    for a single output (a probability) whether it is at least 0.5."""
    import numpy

    output = numpy.asarray(output).reshape(len(output), -1)
    predicted = output.argmax(axis=1) if output.shape[1] > 1 else (output[:, 0] >= 0.5)
    return float(numpy.mean(predicted.astype(numpy.int64) == numpy.asarray(target).reshape(-1)))


def checkpoint_name(epoch: int) -> str:
    return f"checkpoint-{epoch:04d}"


def end_of_epoch(epoch: int, metrics: dict[str, float], verbose: int, rank: int) -> None:
    """The epoch's metrics (already averaged over ranks) to the live view, and a line on rank 0."""
    reporting.report(epoch=epoch, **cast(dict[str, Any], metrics))
    if verbose and rank == 0:
        shown = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items())
        print(f"epoch {epoch}: {shown}", flush=True)
