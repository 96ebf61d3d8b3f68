"""What an estimator's fit leaves besides the model, read back with the tools' own readers:
TensorBoard's event reader on ``model_dir/logs``, MLflow's client on a real local tracking store
(SQLite and an artifact folder in the test's temporary folder)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


@contextmanager
def active_mlflow_run(folder: Path) -> Iterator[tuple[Any, str]]:
    """An MLflow run active in this process (as a notebook's ``mlflow.start_run()``), on a
    store of its own: (MLflow's client, the run's id)."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    try:
        experiment = mlflow.create_experiment("fit", artifact_location=(folder / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            yield mlflow.MlflowClient(), run.info.run_id
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(previous)


def event_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the one run folder in ``folder``, as TensorBoard reads them."""
    from tensorboard.backend.event_processing import event_accumulator

    (run,) = [path for path in folder.iterdir() if path.is_dir()]
    reader = event_accumulator.EventAccumulator(str(run), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def check_fit_records(model_dir: Path, client: Any, run_id: str, model: Any) -> None:
    """The fit's mean loss per epoch (as ``model.history`` has it) in its event files and in
    the MLflow run; its params and the exported model's folder in the MLflow run."""
    losses = [epoch["loss"] for epoch in model.history]
    scalars = event_scalars(model_dir / "logs")
    assert [value for _, value in scalars["loss"]] == pytest.approx(losses, rel=1e-5)
    assert {"loss/rank_0", "loss/rank_1", "val_loss", "batch_loss"} <= set(scalars)
    logged = client.get_run(run_id).data
    assert [m.value for m in sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)] == (
        pytest.approx(losses, rel=1e-5)
    )
    expected = {"num_proc": "2", "batch_size": "32", "epochs": "2", "model": "Sequential"}
    assert {key: logged.params.get(key) for key in expected} == expected
    assert logged.params["feature_cols"] == "image" and logged.params["np"] == "2"
    exported = {item.path for item in client.list_artifacts(run_id, "model")}
    assert {"model/state_dict.pt", "model/module.pkl", "model/metadata"} <= exported
