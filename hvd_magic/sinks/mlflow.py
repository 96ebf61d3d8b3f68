"""A run in MLflow: into the notebook's active MLflow run (or one ``mlflow=yes`` starts), the
run's options as params, the mean across ranks of each reported metric at each step, and at
the end the timeline file (``timeline=``) and the run's static record (the HTML page the live
view leaves) as artifacts, with what the straggler watch said (``stragglers.txt``). Without an
active run, and without ``mlflow=yes``, nothing happens:
mlflow is not even imported.

Metrics are sent from a thread of the sink's own, in batches: a slow tracking server never
holds up the run or its live view.
"""

from __future__ import annotations

import os
import queue
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hvd_magic.errors import LaunchError, RunInterrupted
from hvd_magic.options.extras import mlflow_module
from hvd_magic.protocol import Message, Straggler
from hvd_magic.sinks.scalars import Point, Scalars

if TYPE_CHECKING:
    from hvd_magic.options import RunOptions

__all__ = ["MlflowSink", "active_run_id", "log_model", "log_params", "open_sink", "plain_params"]

SEND_SECONDS = 2.0  # metrics wait at most this long before they are sent
BATCH = 1000  # MLflow's limit of metrics in one log_batch
PARAMS_BATCH = 100  # ... and of params
PARAM_LENGTH = 500  # MLflow's oldest servers keep 500 characters of a param's value
CLOSE_SECONDS = 60.0  # at the end, how long the last metrics may take to arrive
ARTIFACTS = "hvd_magic"  # the run's files go under ARTIFACTS/<run name>/


def active_run_id() -> str | None:
    """The notebook's active MLflow run, without importing mlflow (a run can only be active
    once the notebook imported it)."""
    module = sys.modules.get("mlflow")
    run = module.active_run() if module is not None else None
    return None if run is None else str(run.info.run_id)


def open_sink(options: RunOptions, name: str) -> MlflowSink | None:
    """The sink for the active MLflow run, or for a new one with ``mlflow=yes``; None when there
    is neither (or with ``mlflow=no``). The run's params are logged first: a tracking store that
    fails here fails a run that asked for MLflow (``mlflow=yes``), and is said for the others."""
    run_id = active_run_id() if options.mlflow is not False else None
    mlflow, owned = mlflow_module() if run_id or options.mlflow else None, False
    if mlflow is None:
        return None
    try:
        if run_id is None:
            run_id, owned = mlflow.start_run(run_name=name).info.run_id, True
        client = mlflow.MlflowClient()
        log_params(client, run_id, {**options_params(options), **plain_params(options.params)})
    except Exception as err:  # noqa: BLE001 - whatever the tracking store raises
        if owned:
            mlflow.end_run("FAILED")
        where = f"MLflow at {mlflow.get_tracking_uri()}: {type(err).__name__}: {err}"
        if not options.mlflow:
            print(f"hvd_magic: not logging this run to the active MLflow run: {where}", file=sys.stderr)
            return None
        raise LaunchError(
            f"mlflow=yes: could not log to {where}. Check mlflow.set_tracking_uri(...) (or "
            "MLFLOW_TRACKING_URI), or drop mlflow=yes."
        ) from None
    sink = MlflowSink(client, run_id, options.ranks, name, owned)
    sink.timeline = options.timeline
    return sink


def log_params(client: Any, run_id: str, params: dict[str, str]) -> None:
    """Log ``params``; one the run already has with another value (MLflow params never change:
    an earlier run in the same MLflow run) is left, and said."""
    from mlflow.entities import Param

    have = client.get_run(run_id).data.params
    new = [Param(key, value) for key, value in params.items() if key not in have]
    for start in range(0, len(new), PARAMS_BATCH):
        client.log_batch(run_id, params=new[start : start + PARAMS_BATCH])
    clash = [
        f"{key}={value} (has {have[key]})" for key, value in params.items() if have.get(key, value) != value
    ]
    if clash:
        print(
            f"hvd_magic: MLflow run {run_id} already has other values for {', '.join(clash)}; MLflow "
            "params cannot change, so these were not logged: start an MLflow run per training run "
            "(mlflow.start_run()) to keep each one's",
            file=sys.stderr,
        )


def options_params(options: RunOptions) -> dict[str, str]:
    """The run's options, as the cell would give them (env: its names only, values may be secrets)."""
    given: dict[str, Any] = {
        "np": options.np,
        "launcher": options.launcher,
        "env": ",".join(sorted(options.env)) or None,
        "return": ",".join(options.return_names) or None,
        "timeout": options.timeout,
        "timeline": options.timeline,
        "data": options.data_name if options.data is not None else None,
        "remainder": "keep" if options.keep_remainder else None,
        "retries": options.retries or None,
        "checkpoint_dir": options.checkpoint_dir,
        "logdir": options.logdir,
    }
    return {key: str(value) for key, value in given.items() if value is not None}


def plain_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Parameter values as MLflow keeps them: plain values as text, objects (a model, an
    optimizer, a loss function) by their type's name."""
    plain = (str, int, float, bool)

    def text(value: Any) -> str:
        if isinstance(value, plain) or value is None:
            return str(value)
        if isinstance(value, (list, tuple)) and all(isinstance(v, plain) for v in value):
            return ",".join(map(str, value))
        return getattr(value, "__name__", None) or type(value).__name__

    return {name: text(value)[:PARAM_LENGTH] for name, value in params.items()}


def metric_key(name: str) -> str:
    """MLflow takes letters, digits, ``_ - . : /`` and spaces in a metric's name."""
    return re.sub(r"[^\w\-.:/ ]", "_", name)


class MlflowSink:
    """Logs one run into the MLflow run ``run_id`` (and ends it when ``owned``: it started it)."""

    def __init__(
        self,
        client: Any,
        run_id: str,
        ranks: int,
        name: str,
        owned: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from mlflow.entities import Metric

        self.client, self.run_id, self.name, self.owned, self.clock = client, run_id, name, owned, clock
        self.timeline: str | None = None
        self.scalars = Scalars(ranks)
        self.page = _page_model(ranks)
        self._metric = Metric
        self._waiting: list[Any] = []
        self._sent = self._began = clock()
        self.stragglers: list[str] = []  # what the straggler watch said, at the seconds since the run began
        self._sender = _Sender(client, run_id)

    def message(self, message: Message) -> None:
        if self.page is not None:
            self.page.apply(message)
        now = self.clock()
        if isinstance(message.record, Straggler):
            self.stragglers.append(f"{now - self._began:8.1f} s  {message.record.text()}")
        self._add(self.scalars.take(message, now))
        if self._waiting and (len(self._waiting) >= BATCH or now - self._sent >= SEND_SECONDS):
            self._send(now)

    def close(self, outcome: BaseException | None) -> None:
        self._add(self.scalars.rest())
        self._send(self.clock())
        try:
            unsent = self._sender.close(CLOSE_SECONDS)
            self._log_files()
        finally:
            if self.owned:
                mlflow_module().end_run(_status(outcome))
        if unsent:
            raise unsent

    def _add(self, points: list[Point]) -> None:
        for point in points:
            if point.rank is None:
                key, stamp = metric_key(point.name), int(point.wall_time * 1000)
                self._waiting.append(self._metric(key, point.value, stamp, point.step))

    def _send(self, now: float) -> None:
        if self._waiting:
            self._sender.queue.put(self._waiting)
        self._waiting, self._sent = [], now

    def _log_files(self) -> None:
        folder = f"{ARTIFACTS}/{self.name}"
        if self.timeline and os.path.exists(self.timeline):
            self.client.log_artifact(self.run_id, self.timeline, folder)
        if self.page is not None:
            from hvd_magic.widgets.render import final_html

            self.client.log_text(self.run_id, final_html(self.page), f"{folder}/run.html")
        if self.stragglers:
            self.client.log_text(self.run_id, "\n".join(self.stragglers) + "\n", f"{folder}/stragglers.txt")


def log_model(model: Any, saved: str | None = None) -> None:
    """An estimator's fitted model into the notebook's active MLflow run, as the folder
    ``model.save`` writes (``saved``: where it already is); nothing without an active run."""
    run_id = active_run_id()
    if run_id is None:
        return
    client = mlflow_module().MlflowClient()
    if saved is not None:
        client.log_artifacts(run_id, saved, "model")
        return
    with tempfile.TemporaryDirectory(prefix="hvd_magic-model-") as folder:
        model.write().save(os.path.join(folder, "model"))
        client.log_artifacts(run_id, os.path.join(folder, "model"), "model")


def _page_model(ranks: int) -> Any:
    """The live view's model, for the static record at the end (None without numpy)."""
    try:
        from hvd_magic.widgets import render  # noqa: F401 - the page's renderer needs numpy
        from hvd_magic.widgets.state import RunModel
    except ImportError:
        return None
    return RunModel(ranks)


def _status(outcome: BaseException | None) -> str:
    if outcome is None:
        return "FINISHED"
    return "KILLED" if isinstance(outcome, (RunInterrupted, KeyboardInterrupt)) else "FAILED"


class _Sender:
    """Sends metric batches to the tracking store from a thread of its own."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.queue: queue.Queue[list[Any] | None] = queue.Queue()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, name="hvd_magic-mlflow", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (metrics := self.queue.get()) is not None:
            for start in range(0, len(metrics), BATCH):
                if self.error is None:
                    try:
                        self.client.log_batch(self.run_id, metrics=metrics[start : start + BATCH])
                    except Exception as err:  # noqa: BLE001 - said once, at the end
                        self.error = err

    def close(self, timeout: float) -> Exception | None:
        """Wait up to ``timeout`` for the metrics sent so far; an error saying what was lost."""
        self.queue.put(None)
        self.thread.join(timeout)
        if self.error is not None:
            return RuntimeError(
                f"MLflow did not take the run's metrics: {type(self.error).__name__}: {self.error}"
            )
        if self.thread.is_alive():
            return RuntimeError(
                f"MLflow took over {timeout:.0f} s for the run's metrics; the rest are sent on"
            )
        return None
