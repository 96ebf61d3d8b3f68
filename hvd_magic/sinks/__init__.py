"""Where a run's record goes besides the live view: TensorBoard event files (``logdir=``) and
MLflow (the notebook's active MLflow run, or ``mlflow=yes``). Written on the notebook's side from
the messages the ranks send anyway, so executors need no shared file system; each sink imports
its package only when it is used (optional extras: ``hvd_magic[tensorboard,mlflow]``).

The run's supervision feeds every rank message to ``Sinks.message`` and tells ``Sinks.close`` the run's
outcome (``with make_sinks(options) as sinks:``), without knowing which sinks there are. A sink
that fails mid-run is dropped with one line on stderr: the training goes on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from hvd_magic.protocol import Message

if TYPE_CHECKING:
    from hvd_magic.options import RunOptions

__all__ = ["Sink", "Sinks", "make_sinks", "model_dir_logdir", "run_name"]


class Sink(Protocol):
    """Takes each rank message of a run as it arrives, then the run's outcome (None: it
    finished; else the error the run ends with)."""

    def message(self, message: Message) -> None: ...

    def close(self, outcome: BaseException | None) -> None: ...


class Sinks:
    """The run's sinks, fed together; one failing is dropped, never the run."""

    def __init__(self, sinks: dict[str, Sink] | None = None) -> None:
        self.sinks = dict(sinks or {})  # what it writes (for messages) -> the sink

    def message(self, message: Message) -> None:
        for what, sink in list(self.sinks.items()):
            try:
                sink.message(message)
            except Exception as err:  # noqa: BLE001 - a sink's failure must not end the training
                del self.sinks[what]
                _say(f"{what} stopped during the run ({type(err).__name__}: {err}); the run goes on")
                # ended as it can be, here: MLflow keeps the run it began as this thread's active run
                with contextlib.suppress(Exception):
                    sink.close(err)

    def shown_in(self, view: Any) -> Any:
        """The run's view, handed to the sinks that read what it already folds (a sink's
        ``shown_in``: the kernel's record takes the live view's model), and back."""
        for sink in self.sinks.values():
            lend = getattr(sink, "shown_in", None)
            if lend is not None:
                lend(view)
        return view

    def supervising(self, run: Any) -> None:
        """The run's supervisor (each attempt's), handed to the sinks that act on it (a sink's
        ``supervising``: the kernel's record, asked from the Horovod panel to stop or for stacks)."""
        for sink in self.sinks.values():
            act = getattr(sink, "supervising", None)
            if act is not None:
                act(run)

    def returned(self, value: Any) -> Any:
        """The run's value, handed to the sinks that keep it (a sink's ``returned``), and back."""
        for sink in self.sinks.values():
            keep = getattr(sink, "returned", None)
            if keep is not None:
                keep(value)
        return value

    def close(self, outcome: BaseException | None) -> None:
        for what, sink in self.sinks.items():
            try:
                sink.close(outcome)
            except Exception as err:  # noqa: BLE001 - the run's own value or error comes first
                _say(f"{what} could not be finished: {type(err).__name__}: {err}")
        self.sinks.clear()

    def __enter__(self) -> Sinks:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close(error)


_named = {"last": 0}  # the millisecond of this process's last run name
_naming = threading.Lock()


def run_name(clock: float | None = None) -> str:
    """A run's name, for its TensorBoard folder and MLflow run: ``20260521-143012.345-3fa2c1``.
    Names sort in the order their runs started: by the millisecond, and strictly within one
    process (a name is never given the millisecond of an earlier one: two cells in one second
    sorted at random by their random part). ``clock``: seconds since the epoch (now)."""
    with _naming:
        ms = _named["last"] = max(round((time.time() if clock is None else clock) * 1000), _named["last"] + 1)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(ms // 1000))
    return f"{stamp}.{ms % 1000:03d}-{uuid.uuid4().hex[:6]}"


def make_sinks(options: RunOptions) -> Sinks:
    """The sinks ``options`` ask for: TensorBoard with ``logdir=``, MLflow with an active MLflow
    run or ``mlflow=yes``."""
    name = run_name()
    sinks: dict[str, Sink] = {}
    if options.logdir:
        from hvd_magic.sinks.tensorboard import TensorBoardSink

        folder = os.path.join(options.logdir, name)
        sinks[f"TensorBoard logging to {folder}"] = TensorBoardSink(folder, options.ranks)
        _say(f"TensorBoard event files in {folder} (to look: tensorboard --logdir {options.logdir})")
    if options.mlflow is not False:
        from hvd_magic.sinks.mlflow import open_sink

        try:
            sink = open_sink(options, name)
        except BaseException:
            Sinks(sinks).close(None)
            raise
        if sink is not None:
            sinks[f"MLflow logging to run {sink.run_id}"] = sink
    return Sinks(sinks)


def model_dir_logdir(folder: str | None) -> str | None:
    """Where an estimator's run writes its event files by default: ``model_dir/logs`` (as
    horovod.spark's estimators wrote theirs into their run folder), when tensorboard is installed."""
    from hvd_magic.options.extras import tensorboard_record_writer

    try:
        tensorboard_record_writer()
    except ImportError:
        return None
    return os.path.join(folder, "logs") if folder else None


def _say(text: str) -> None:
    print(f"hvd_magic: {text}", file=sys.stderr, flush=True)
