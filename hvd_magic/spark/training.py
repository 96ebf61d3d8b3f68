"""What the estimators' training loops share on the ranks: the rank's rows as numpy arrays, the
validation hold-out, each epoch's order, and the per-epoch report. Their checkpoints are
``hvd_magic.checkpoint`` / ``hvd_magic.resume``, as a cell's: the run's store, in
``model_dir/checkpoints`` when there is one, serves a retry within the fit and a new fit alike."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from hvd_magic.errors import DataError
from hvd_magic.rank import reporting
from hvd_magic.spark.columns import feature_array, label_array

__all__ = [
    "Rows",
    "TrainSpec",
    "accuracy",
    "is_accuracy",
    "batches",
    "end_of_batch",
    "end_of_epoch",
    "load_rows",
    "steps_per_epoch",
    "validation_batches",
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
    validation: float | str  # a share of each rank's rows, or a column marking validation rows
    seed: int
    shuffle: bool
    verbose: int
    save_checkpoints: bool = True  # rank 0 checkpoints each epoch (for model_dir, or for retries)
    send_files: bool = False  # rank 0 sends the callbacks' files (to model_dir)
    callbacks: list[Any] = field(default_factory=list)
    custom_objects: dict[str, Any] = field(default_factory=dict)  # Keras: what its model's file names
    input_shapes: list[list[int]] | None = None  # per model input, batch first (columns.model_inputs)
    val_batch_size: int = 0  # 0: batch_size
    train_steps: int | None = None  # batches per epoch on each rank; None: the rows over batch_size
    val_steps: int | None = None  # validation batches per epoch on each rank; None: all
    backward_passes: int = 1  # torch: batches whose gradients add up before one allreduce
    compression: Any = None  # Horovod's gradient compression
    hide_gpus: bool = False  # use_gpu=False
    extra: dict[str, Any] = field(default_factory=dict)  # a framework's own (loss constructors ...)


@dataclass
class Rows:
    x: Any
    y: Any
    val_x: Any
    val_y: Any


def load_rows(spec: TrainSpec) -> Rows:
    """This rank's shard as numpy arrays, validation rows apart: those the ``validation`` column
    marks, or a ``validation`` share of them drawn with the run's seed (every rank then holds as
    many; not the shard's last rows: data sorted by its label would be validated on one label)."""
    from hvd_magic.data import shard

    table = shard("arrow")
    x, y = feature_array(table, spec.feature_cols), label_array(table, spec.label_cols)
    if isinstance(spec.validation, str):
        held = table.column(spec.validation).to_numpy(zero_copy_only=False).astype(bool)
        return Rows(x[~held], y[~held], x[held], y[held])
    import numpy

    drawn = numpy.random.default_rng(spec.seed or 0).permutation(len(x))[
        : int(round(len(x) * spec.validation))
    ]
    held = numpy.zeros(len(x), dtype=bool)
    held[drawn] = True
    return Rows(x[~held], y[~held], x[held], y[held])


def steps_per_epoch(spec: TrainSpec, total_rows: int, ranks: int) -> int:
    """Batches every rank takes each epoch (they must agree: each step is an allreduce):
    ``train_steps``, else all rows over the batch size and the ranks, as horovod.spark counts."""
    return spec.train_steps or max(1, -(-total_rows // (spec.batch_size * ranks)))


def batches(
    rows: int, batch_size: int, seed: int, epoch: int, rank: int, shuffle: bool, steps: int = 0
) -> Iterator[Any]:
    """Index arrays of one epoch's ``steps`` batches (default: one pass over the rows): a new
    order per epoch, rank and pass; a rank whose rows run out before its steps goes round again."""
    import numpy

    if rows == 0:
        raise DataError(
            f"rank {rank} has no training rows (its rows are all validation rows, or its shard is "
            "empty): mark fewer rows with the validation column, or give more rows"
        )
    steps, taken, turn = steps or -(-rows // batch_size), 0, 0
    while taken < steps:
        order = numpy.arange(rows)
        if shuffle:
            numpy.random.default_rng([seed, epoch, rank] + ([turn] if turn else [])).shuffle(order)
        for start in range(0, rows, batch_size):
            if taken == steps:
                return
            yield order[start : start + batch_size]
            taken += 1
        turn += 1


def validation_batches(rows: int, batch_size: int, steps: int | None) -> Iterator[slice]:
    """The validation rows in order, ``batch_size`` at a time, at most ``steps`` batches."""
    for number, start in enumerate(range(0, rows, batch_size)):
        if steps is not None and number == steps:
            return
        yield slice(start, start + batch_size)


def is_accuracy(metric: Any) -> bool:
    """The metric named 'accuracy' (or Keras' 'acc'); a metric object is never equal to it."""
    return isinstance(metric, str) and metric in ("accuracy", "acc")


def accuracy(output: Any, target: Any) -> float:
    """The share of rows whose predicted class is the label: the largest output's index, or
    for a single output (a probability) whether it is at least 0.5; a one-hot (or
    probability) label's class is its largest entry, as Keras' categorical accuracy takes it."""
    import numpy

    output = numpy.asarray(output).reshape(len(output), -1)
    target = numpy.asarray(target).reshape(len(output), -1)
    predicted = output.argmax(axis=1) if output.shape[1] > 1 else (output[:, 0] >= 0.5)
    expected = target.argmax(axis=1) if target.shape[1] > 1 else target[:, 0]
    return float(numpy.mean(predicted.astype(numpy.int64) == expected))


def end_of_batch(spec: TrainSpec, epoch: int, number: int, steps: int, loss: float) -> None:
    """A training batch's loss to the live view as ``batch_loss``, at the fit's own step (steps
    count on across epochs, so the progress bar and ETA cover the whole fit)."""
    reporting.report(
        step=(epoch - 1) * steps + number + 1, total=spec.epochs * steps, epoch=epoch, batch_loss=loss
    )


def end_of_epoch(epoch: int, steps: int, metrics: dict[str, float], verbose: int, rank: int) -> None:
    """The epoch's metrics (already averaged over ranks), named as in the history, to the live
    view at the epoch's last step, and a line on rank 0."""
    reporting.report(step=epoch * steps, epoch=epoch, **cast(dict[str, Any], metrics))
    if verbose and rank == 0:
        shown = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items())
        print(f"epoch {epoch}: {shown}", flush=True)
