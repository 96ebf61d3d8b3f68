"""MLflow: real ranks logging into a real local tracking store (SQLite in a temporary folder),
read back through MLflow's own client."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from hvd_magic import HorovodRunner, RankFailedError
from hvd_magic.options import make_options
from hvd_magic.sinks import make_sinks
from hvd_magic.sinks.mlflow import ARTIFACTS, log_model, log_params

# Each rank reports losses for steps 1-4 that depend on its rank: the mean at step s is s + 0.5.
REPORTING_CELL = """
import horovod.torch as hvd, hvd_magic, torch
hvd.init()
for step in range(1, 5):
    hvd_magic.report(step=step, total=4, loss=step + float(hvd.rank()))
hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
"""


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh SQLite tracking store for the test, and MLflow's client on it. MLflow puts the
    artifacts of a SQLite store's runs in ./mlruns: the test's folder, not the checkout."""
    import mlflow  # here: collecting the module does not import MLflow (1.7 CPU-s)

    monkeypatch.chdir(tmp_path)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        yield mlflow.MlflowClient()
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(previous)


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def artifacts(client, run_id: str, path: str = ARTIFACTS) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, path):
        found += artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def test_a_cell_logs_into_the_active_mlflow_run(ip, store, tmp_path):
    import mlflow

    timeline = tmp_path / "timeline.json"
    with mlflow.start_run() as run:
        value = ip.run_cell_magic("horovod", f"np=-2 timeline={timeline}", REPORTING_CELL)
        assert mlflow.active_run().info.run_id == run.info.run_id  # still the user's, still going
    assert value == 2.0
    logged = store.get_run(run.info.run_id)
    assert logged.data.params["np"] == "-2"
    assert logged.data.params["timeline"] == str(timeline)
    assert logged.data.params["launcher"] in ("mpi", "gloo")
    assert history(store, run.info.run_id, "loss") == [(1, 1.5), (2, 2.5), (3, 3.5), (4, 4.5)]
    files = artifacts(store, run.info.run_id)
    (page,) = [path for path in files if path.endswith("/run.html")]
    assert re.fullmatch(rf"{ARTIFACTS}/\d{{8}}-\d{{6}}\.\d{{3}}-[0-9a-f]{{6}}/run.html", page)
    html = store.download_artifacts(run.info.run_id, page, str(tmp_path))
    assert "loss" in open(html).read()  # the record's curves and summary
    assert page.replace("run.html", "timeline.json") in files


def test_mlflow_yes_starts_a_run_of_its_own_and_ends_it_with_the_outcome(store):
    import mlflow

    def main(fail):
        import hvd_magic

        hvd_magic.report(step=1, loss=3.0)
        hvd_magic.rank.reporting.current().flush()  # the point is out before the error is
        if fail:
            raise ValueError("boom")

    HorovodRunner(np=-2, mlflow=True).run(main, fail=False)
    assert mlflow.active_run() is None  # ended, not left active in the notebook
    with pytest.raises(RankFailedError, match="boom"):
        HorovodRunner(np=-2, mlflow=True).run(main, fail=True)
    runs = store.search_runs(["0"], order_by=["attributes.start_time ASC"])
    assert [run.info.status for run in runs] == ["FINISHED", "FAILED"]
    assert [history(store, run.info.run_id, "loss") for run in runs] == [[(1, 3.0)], [(1, 3.0)]]
    assert all(run.data.params["np"] == "-2" for run in runs)


def test_without_an_active_run_nothing_is_logged_and_mlflow_is_not_imported(monkeypatch, store):
    import mlflow

    monkeypatch.delitem(sys.modules, "mlflow")
    with make_sinks(make_options(np=-2)) as sinks:
        assert sinks.sinks == {}
    assert "mlflow" not in sys.modules
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    with make_sinks(make_options(np=-2, mlflow="no")) as sinks:
        mlflow.start_run()
        assert sinks.sinks == {}  # mlflow=no: not even into an active run
    assert store.search_runs(["0"])[0].data.params == {}


def test_mlflow_yes_without_mlflow_says_what_to_install(ip, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    with pytest.raises(UsageError, match=re.escape("pip install hvd_magic[mlflow]")):
        ip.run_cell_magic("horovod", "np=-2 mlflow=yes", "1")
    with pytest.raises(ValueError, match=re.escape("pip install hvd_magic[mlflow]")):
        HorovodRunner(np=-2, mlflow=True)


def test_what_the_straggler_watch_said_is_an_artifact_of_the_run(store):
    from hvd_magic.protocol import Message, Straggler

    said = [
        Straggler(1, "hostB", 0.9, 9.5, 0.7, 10.0, "data wait: …"),
        Straggler(1, "hostB", 9.0, 9.5, 0.7, 10.0, recovered=True),
    ]
    with make_sinks(make_options(np=-2, mlflow="yes")) as sinks:
        for straggler in said:
            sinks.message(Message(straggler, straggler.slow_rank))
    (run,) = store.search_runs(["0"])
    (path,) = [p for p in artifacts(store, run.info.run_id) if p.endswith("stragglers.txt")]
    lines = (Path(store.download_artifacts(run.info.run_id, path))).read_text().splitlines()
    assert [line.split(" s  ", 1)[1] for line in lines] == [straggler.text() for straggler in said]


def test_params_an_mlflow_run_already_has_are_kept_and_the_clash_said(store, capsys):
    run = store.create_run("0")
    log_params(store, run.info.run_id, {"np": "-2", "launcher": "gloo"})
    log_params(store, run.info.run_id, {"np": "-4", "launcher": "gloo", "timeout": "60"})
    assert store.get_run(run.info.run_id).data.params == {"np": "-2", "launcher": "gloo", "timeout": "60"}
    assert "np=-4 (has -2)" in capsys.readouterr().err


def test_an_estimators_fitted_model_folder_goes_to_the_active_run(store, tmp_path):
    import mlflow

    folder = tmp_path / "model"
    (folder / "metadata").mkdir(parents=True)
    (folder / "metadata" / "part-00000").write_text("{}")
    (folder / "state_dict.pt").write_bytes(b"weights")
    log_model(None, saved=str(folder))  # no active run: nothing
    assert store.search_runs(["0"]) == []
    with mlflow.start_run() as run:
        log_model(None, saved=str(folder))
    assert sorted(artifacts(store, run.info.run_id, "model")) == [
        "model/metadata/part-00000",
        "model/state_dict.pt",
    ]
