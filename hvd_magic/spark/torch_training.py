"""TorchEstimator on the ranks: Horovod training of the shard, a checkpoint per epoch from rank 0,
and (on the executors) the predict function ``transform`` uses."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from .. import reporting
from .training import (
    Rows,
    TrainSpec,
    accuracy,
    batches,
    checkpoint_name,
    end_of_epoch,
    is_accuracy,
    load_rows,
)

__all__ = ["make_predictor", "train"]


def train(spec: TrainSpec) -> dict[str, Any]:
    """Runs on every rank; rank 0's value (state_dict bytes, history) is the fit's result."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(spec.seed)
    rows = load_rows(spec)
    model = spec.model
    optimizer = type(spec.optimizer)(model.parameters(), **spec.optimizer.defaults)
    start, history = _resume(spec, model, optimizer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for epoch in range(start + 1, spec.epochs + 1):
        metrics = {"loss": _train_epoch(spec, model, optimizer, rows, epoch)}
        if len(rows.val_x):
            metrics |= _evaluate(spec, model, rows)
        metrics = {
            name: hvd.allreduce(torch.tensor(value), name=f"epoch.{name}").item()
            for name, value in metrics.items()
        }
        history.append(metrics)
        end_of_epoch(epoch, metrics, spec.verbose, hvd.rank())
        if hvd.rank() == 0 and spec.save_checkpoints:
            state = {
                "epoch": epoch,
                "history": history,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
            }
            reporting.send_file(checkpoint_name(epoch) + ".pt", _to_bytes(state))
    return {"state": _to_bytes(model.state_dict()), "history": history, "width": int(rows.x.shape[1])}


def _resume(spec: TrainSpec, model: Any, optimizer: Any) -> tuple[int, list[dict[str, float]]]:
    if spec.checkpoint is None:
        return 0, []
    import torch

    state = torch.load(io.BytesIO(spec.checkpoint), weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"]), list(state["history"])


def _tensors(x: Any, y: Any) -> tuple[Any, Any]:
    import torch

    return torch.from_numpy(x), torch.from_numpy(y)


def _loss(spec: TrainSpec, output: Any, target: Any) -> Any:
    if output.dim() == 2 and output.shape[1] == 1 and target.dim() == 1 and target.is_floating_point():
        target = target.unsqueeze(1)  # a one-value regression output against a scalar label
    return spec.loss(output, target)


def _train_epoch(spec: TrainSpec, model: Any, optimizer: Any, rows: Rows, epoch: int) -> float:
    import horovod.torch as hvd

    model.train()
    order = list(batches(len(rows.x), spec.batch_size, spec.seed, epoch, hvd.rank(), spec.shuffle))
    total = 0.0
    for step, index in enumerate(order, 1):
        x, y = _tensors(rows.x[index], rows.y[index])
        optimizer.zero_grad()
        loss = _loss(spec, model(x), y)
        loss.backward()
        optimizer.step()
        total += float(loss.item())
        reporting.report(step=step, total=len(order), epoch=epoch, loss=float(loss.item()))
    return total / max(len(order), 1)


def _evaluate(spec: TrainSpec, model: Any, rows: Rows) -> dict[str, float]:
    import torch

    model.eval()
    with torch.no_grad():
        x, y = _tensors(rows.val_x, rows.val_y)
        output = model(x)
        found = {"val_loss": float(_loss(spec, output, y).item())}
        for metric in spec.metrics:
            name, value = _metric(metric, output, y)
            found[f"val_{name}"] = value
    return found


def _metric(metric: Any, output: Any, target: Any) -> tuple[str, float]:
    if is_accuracy(metric):
        return str(metric), accuracy(output.numpy(), target.numpy())
    return getattr(metric, "__name__", type(metric).__name__), float(metric(output, target))


def _to_bytes(value: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def make_predictor(module_blob: bytes) -> Callable[[Any], Any]:
    """For ``predict_batch_udf``: load the module once per Python worker, predict in batches."""
    import cloudpickle
    import numpy
    import torch

    module = cloudpickle.loads(module_blob)
    module.eval()

    def predict(inputs: Any) -> Any:
        with torch.no_grad():
            output = module(torch.from_numpy(numpy.ascontiguousarray(inputs, dtype=numpy.float32)))
        return output.reshape(len(inputs), -1).numpy()

    return predict
