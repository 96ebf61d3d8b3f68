"""One-line progress reporting for the common training loops.

Keras::

    model.fit(x, y, epochs=3, callbacks=[hvd_magic.LiveCallback()])

PyTorch (or any loop)::

    for epoch in range(epochs):
        for x, y in hvd_magic.progress(loader, epoch=epoch, epochs=epochs):
            loss = train_step(x, y)
            hvd_magic.report(loss=loss.item())   # a metric at the current step

With ``stoppable=True`` (``progress(..., stoppable=True)``, ``LiveCallback(stoppable=True)``)
the run's first interrupt stops it at a step boundary (``hvd_magic.stopping()`` before each
step: a collective, so every rank must run the same loop): the loop, or ``fit``, ends and the
cell returns rank 0's value. Off by default: a collective hidden in a helper would hang a loop
that only some ranks run (an evaluation on rank 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, cast

from hvd_magic.rank.checkpoints import stopping
from hvd_magic.rank.reporting import report

__all__ = ["LiveCallback", "progress"]  # noqa: F822 - LiveCallback is built on first use

T = TypeVar("T")


def progress(
    iterable: Iterable[T], epoch: int = 0, epochs: int = 1, total: int | None = None, stoppable: bool = False
) -> Iterator[T]:
    """Yields the items of ``iterable``, reporting the step (counted over all epochs) and total;
    with ``stoppable``, ends early when the run is asked to stop (on every rank alike)."""
    per_epoch = total if total is not None else _length(iterable)
    overall = per_epoch * epochs if per_epoch is not None else None
    for index, item in enumerate(iterable):
        if stoppable and stopping():
            return
        step = epoch * per_epoch + index + 1 if per_epoch is not None else index + 1
        report(step=step, total=overall, epoch=epoch)
        yield item


def _length(iterable: object) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None


def _keras_callback_base() -> type:
    import tensorflow as tf

    return cast(type, tf.keras.callbacks.Callback)


class _LiveCallbackMixin:
    """Reports Keras's step, epoch and logs (loss, metrics) after every batch; with
    ``stoppable=True``, ends ``fit`` at a batch boundary when the run is asked to stop."""

    params: dict[str, Any]
    model: Any

    def __init__(self, stoppable: bool = False) -> None:
        super().__init__()
        self.stoppable = stoppable

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._epoch = 0
        self._steps = self.params.get("steps") or 0
        self._total = self._steps * (self.params.get("epochs") or 1) if self._steps else None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        metrics = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        report(step=self._epoch * self._steps + batch + 1, total=self._total, epoch=self._epoch, **metrics)
        if self.stoppable and stopping():
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        validation = {
            k: float(v)
            for k, v in (logs or {}).items()
            if k.startswith("val_") and isinstance(v, (int, float))
        }
        if validation:
            report(**cast(dict[str, Any], validation))


def __getattr__(name: str) -> object:
    # Built on first use so that importing hvd_magic never imports TensorFlow.
    if name == "LiveCallback":
        callback = type(
            "LiveCallback",
            (_LiveCallbackMixin, _keras_callback_base()),
            {"__doc__": _LiveCallbackMixin.__doc__},
        )
        globals()["LiveCallback"] = callback
        return callback
    raise AttributeError(name)
