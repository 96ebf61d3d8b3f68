"""TorchEstimator on the ranks: Horovod training of the shard, resumed from the latest checkpoint
and checkpointed each epoch (``hvd_magic.resume`` / ``checkpoint``), and (on the executors) the
predict function ``transform`` uses.

A batch is trained by a function with horovod.spark's ``train_minibatch`` signature (ours, or
the user's ``train_minibatch_fn``): ``(model, optimizer, transform_outputs, loss_fn, inputs,
labels, sample_weights, backward_passes_per_step, batch_idx) -> (outputs, loss)``; the
optimizer steps every ``backward_passes_per_step`` batches and at the end of the epoch, as
Horovod's ``DistributedOptimizer(backward_passes_per_step=N)`` expects."""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable
from typing import Any

from hvd_magic.rank.checkpoints import checkpoint, resume
from hvd_magic.spark.columns import model_inputs
from hvd_magic.spark.epoch_metrics import Averages
from hvd_magic.spark.training import (
    Rows,
    TrainSpec,
    accuracy,
    batches,
    end_of_batch,
    end_of_epoch,
    is_accuracy,
    load_rows,
    steps_per_epoch,
    validation_batches,
)

__all__ = ["make_predictor", "train", "train_minibatch"]


def train(spec: TrainSpec) -> dict[str, Any]:
    """Runs on every rank; rank 0's value (state_dict bytes, history) is the fit's result."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(spec.seed)
    rows = load_rows(spec)
    model = spec.model
    loss = _loss_function(spec, model)
    optimizer = type(spec.optimizer)(model.parameters(), **spec.optimizer.defaults)
    start, history = _resume(model, optimizer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = {"compression": spec.compression} if spec.compression is not None else {}
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        backward_passes_per_step=spec.backward_passes,
        **compression,
    )
    steps = steps_per_epoch(spec, int(_sum(hvd, [len(rows.x)], "train.rows")[0]), hvd.size())
    for epoch in range(start + 1, spec.epochs + 1):
        averages = Averages(_names(spec))
        _train_epoch(spec, model, optimizer, loss, rows, epoch, steps, averages)
        if _validating(spec):
            _evaluate(spec, model, loss, rows, averages)
        metrics = averages.reduce(lambda sums: _sum(hvd, sums, "epoch.metrics"))
        history.append(metrics)
        end_of_epoch(epoch, steps, metrics, spec.verbose, hvd.rank())
        if hvd.rank() == 0 and spec.save_checkpoints:
            state = {"epoch": epoch, "history": history, "model": model.state_dict()}
            checkpoint(state | {"optimizer": optimizer.state_dict()}, step=epoch)
    return {"state": _to_bytes(model.state_dict()), "history": history, "width": int(rows.x.shape[1])}


def _sum(hvd: Any, values: Any, name: str) -> Any:
    import numpy
    import torch

    vector = torch.from_numpy(numpy.asarray(values, dtype=numpy.float64))
    return hvd.allreduce(vector, op=hvd.Sum, name=name).numpy()


def _validating(spec: TrainSpec) -> bool:
    return isinstance(spec.validation, str) or spec.validation > 0


def _names(spec: TrainSpec) -> list[str]:
    names = [_metric_name(metric) for metric in spec.metrics]
    return ["loss", *names, *(["val_loss", *(f"val_{name}" for name in names)] if _validating(spec) else [])]


def _loss_function(spec: TrainSpec, model: Any) -> Any:
    """``loss``, or what the first of ``loss_constructors`` makes (called as horovod.spark
    calls them, with keyword arguments, here ``model``; or with none if it takes none)."""
    constructors = spec.extra.get("loss_constructors")
    if not constructors:
        return spec.loss
    make = constructors[0]
    return make(model=model) if inspect.signature(make).parameters else make()


def _resume(model: Any, optimizer: Any) -> tuple[int, list[dict[str, float]]]:
    """The epoch and history of the latest checkpoint (this fit's, on a retry, or an earlier
    fit's in model_dir), its weights and optimizer state loaded; (0, []) on a fresh start."""
    state = resume()
    if state is None:
        return 0, []
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"]), list(state["history"])


def _batch(spec: TrainSpec, x: Any, y: Any) -> tuple[list[Any], list[Any]]:
    import torch

    return [torch.from_numpy(part) for part in model_inputs(x, spec.input_shapes)], [torch.from_numpy(y)]


def transform_outputs(outputs: Any, labels: list[Any]) -> tuple[list[Any], list[Any]]:
    """Outputs as a list; each label reshaped to its output's shape when they hold as many
    values (a regression's (rows,) label against its (rows, 1) output), as horovod.spark does."""
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    shaped = [
        label.reshape(output.shape) if output.shape.numel() == label.shape.numel() else label
        for output, label in zip(outputs, labels, strict=False)
    ]
    return outputs, shaped


def train_minibatch(
    model: Any,
    optimizer: Any,
    transform: Callable[[Any, list[Any]], tuple[list[Any], list[Any]]],
    loss_fn: Callable[[list[Any], list[Any], Any], Any],
    inputs: list[Any],
    labels: list[Any],
    sample_weights: Any,
    backward_passes_per_step: int,
    batch_idx: int,
) -> tuple[list[Any], Any]:
    """One batch: a step for the previous group of ``backward_passes_per_step`` batches when a
    group begins, then this batch's gradients (its loss divided by the group's size) added."""
    if batch_idx % backward_passes_per_step == 0:
        if batch_idx:
            optimizer.step()
        optimizer.zero_grad()
    outputs, labels = transform(model(*inputs), labels)
    loss = loss_fn(outputs, labels, sample_weights)
    (loss / backward_passes_per_step if backward_passes_per_step > 1 else loss).backward()
    return outputs, loss


def _train_epoch(
    spec: TrainSpec,
    model: Any,
    optimizer: Any,
    loss: Any,
    rows: Rows,
    epoch: int,
    steps: int,
    averages: Averages,
) -> None:
    import horovod.torch as hvd

    model.train()
    minibatch = spec.extra.get("train_minibatch_fn") or train_minibatch
    order = batches(len(rows.x), spec.batch_size, spec.seed, epoch, hvd.rank(), spec.shuffle, steps)
    for step, index in enumerate(order):
        inputs, labels = _batch(spec, rows.x[index], rows.y[index])
        outputs, value = minibatch(
            model,
            optimizer,
            transform_outputs,
            _loss_fn(loss),
            inputs,
            labels,
            None,
            spec.backward_passes,
            step,
        )
        averages.add("loss", float(value.item()), len(index))
        _add_metrics(spec, averages, "", outputs[0].detach(), labels[0])
        end_of_batch(spec, epoch, step, steps, float(value.item()))
    optimizer.step()  # the last group's gradients


def _loss_fn(loss: Any) -> Callable[[list[Any], list[Any], Any], Any]:
    def loss_fn(outputs: list[Any], labels: list[Any], sample_weights: Any) -> Any:
        return loss(outputs[0], labels[0])

    return loss_fn


def _evaluate(spec: TrainSpec, model: Any, loss: Any, rows: Rows, averages: Averages) -> None:
    import torch

    model.eval()
    size = spec.val_batch_size or spec.batch_size
    with torch.no_grad():
        for part in validation_batches(len(rows.val_x), size, spec.val_steps):
            inputs, labels = _batch(spec, rows.val_x[part], rows.val_y[part])
            outputs, labels = transform_outputs(model(*inputs), labels)
            averages.add("val_loss", float(loss(outputs[0], labels[0]).item()), len(labels[0]))
            _add_metrics(spec, averages, "val_", outputs[0], labels[0])


def _add_metrics(spec: TrainSpec, averages: Averages, prefix: str, output: Any, target: Any) -> None:
    for metric in spec.metrics:
        if is_accuracy(metric):
            value = accuracy(output.numpy(), target.numpy())
        else:
            value = float(metric(output, target))
        averages.add(prefix + _metric_name(metric), value, len(output))


def _metric_name(metric: Any) -> str:
    return str(metric) if is_accuracy(metric) else getattr(metric, "__name__", type(metric).__name__)


def _to_bytes(value: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def make_predictor(module_blob: bytes, shapes: list[list[int]] | None = None) -> Callable[[Any], Any]:
    """For ``predict_batch_udf``: load the module once per Python worker, predict in batches."""
    import cloudpickle
    import numpy
    import torch

    module = cloudpickle.loads(module_blob)
    module.eval()

    def predict(inputs: Any) -> Any:
        flat = numpy.ascontiguousarray(inputs, dtype=numpy.float32)
        with torch.no_grad():
            output = module(*[torch.from_numpy(part) for part in model_inputs(flat, shapes)])
        return output.reshape(len(inputs), -1).numpy()

    return predict
