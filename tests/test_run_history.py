"""The kernel's record of its runs (issue 78): every run is kept with its final record and rank
0's value, whatever watched it; ``%horovod runs`` lists them, ``%horovod last`` / ``runs N``
shows one and returns its value, in any IPython, and in a real kernel whose output no one read."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError
from jupyter_client.manager import KernelManager

from hvd_magic import HorovodRunner, RankFailedError
from hvd_magic.options import make_options
from hvd_magic.protocol import Message, Reports
from hvd_magic.protocol.panel import endpoint_folder
from hvd_magic.run.history import HISTORY, History
from hvd_magic.run.recording import RecordingSink
from hvd_magic.server.kernels import KernelRuns
from hvd_magic.widgets.state import RunModel

from .kernels import Kernel, reply_to
from .panel_helpers import served

FAILING = "from hvd_magic.protocol.env import rank_from_env\nif rank_from_env()[0] == 1:\n    1 / 0\n"
REPORTING = "import hvd_magic\nhvd_magic.report(step=3, total=3, loss=0.25)\n40 + 2\n"


def test_a_cold_cell_is_recorded_with_its_summary_and_value(ip, capsys, tmp_path):
    assert ip.run_cell_magic("horovod", "np=-2", REPORTING) == 42
    number = HISTORY.count
    with served(tmp_path) as panel:  # as the Horovod panel lists it
        row = panel.row(number)
    assert (row["launcher"], row["state"], row["value"]) == ("local · Horovod (mpirun)", "ended", "42")
    capsys.readouterr()
    ip.run_line_magic("horovod", "runs")
    table = capsys.readouterr().out
    assert f"{number:>3}  " in table and "2 ranks local" in table and "finished" in table.splitlines()[-1]
    assert ip.run_line_magic("horovod", "last") == 42
    shown = capsys.readouterr().out
    assert f"run {number}, 2 ranks local: finished\nlaunched by local · Horovod (mpirun)\n" in shown
    assert "hvd_magic: 2 ranks" in shown and "loss 0.25" in shown and "rank 0's value: returned" in shown
    assert ip.run_line_magic("horovod", f"runs {number}") == 42


def test_a_runs_end_is_stamped_before_the_other_sinks_finish(ip, monkeypatch):
    """MLflow's close (its metrics sent, the timeline uploaded: up to a minute) came first: the
    record's end and time included it, and the panel showed the run live meanwhile."""
    from hvd_magic.run import recording
    from hvd_magic.sinks import Sinks

    class Slow:
        closing: float | None = None

        def message(self, message: Message) -> None:
            pass

        def close(self, outcome: BaseException | None) -> None:
            Slow.closing = time.time()

    monkeypatch.setattr(recording, "make_sinks", lambda options: Sinks({"MLflow": Slow()}))
    assert ip.run_cell_magic("horovod", "np=-2 launcher=gloo", "1") == 1
    entry = HISTORY.get()
    assert entry is not None and Slow.closing is not None and entry.ended is not None
    assert entry.ended <= Slow.closing


def test_a_failed_run_is_recorded_with_its_error_and_no_value(ip, capsys):
    with pytest.raises(RankFailedError):
        ip.run_cell_magic("horovod", "np=-2", FAILING)
    assert ip.run_line_magic("horovod", "last") is None
    shown = capsys.readouterr().out
    assert ": RankFailedError: rank 1 on " in shown and "ZeroDivisionError" in shown
    assert "no value (it did not finish)" in shown


def test_a_live_sessions_cells_and_a_runners_call_are_recorded(ip, capsys):
    ip.run_line_magic("horovod", "start np=-2")
    try:
        assert ip.run_cell_magic("horovod", "", "7") == 7
        assert ip.run_line_magic("horovod", "last") == 7
        shown = capsys.readouterr().out
        assert "live session, 2 of 2 ranks: finished\nlaunched by local · Horovod (mpirun)" in shown
    finally:
        ip.run_line_magic("horovod", "stop")
    assert HorovodRunner(np=-2, launcher="gloo").run(lambda: 5) == 5
    entry = HISTORY.get()
    assert entry is not None and (entry.where, entry.outcome, entry.value) == ("2 ranks local", "finished", 5)
    assert entry.launcher == "local · Horovod (Gloo)"


def test_what_is_asked_for_wrongly_is_said(ip):
    with pytest.raises(UsageError, match=r"usage: %horovod runs, %horovod runs N .*not 'x'"):
        ip.run_line_magic("horovod", "runs x")
    with pytest.raises(UsageError, match=r"no run 99999 in this kernel's record \(kept: .*\); %horovod runs"):
        ip.run_line_magic("horovod", "runs 99999")
    with pytest.raises(UsageError, match=r"usage: %horovod start\|status\|stacks\|debug\|stop\|runs\|last"):
        ip.run_line_magic("horovod", "rnus")


def test_the_oldest_runs_make_room():
    history = History(keep=2)
    for _ in range(3):
        history.begin(make_options(np=-2))
    assert [entry.number for entry in history.entries] == [2, 3] and history.get(1) is None
    assert history.get().number == 3 and "running" in history.table()


def test_the_record_reads_the_live_views_model_rather_than_fold_every_report_twice():
    entry = History().begin(make_options(np=-2))
    sink, view = RecordingSink(entry), SimpleNamespace(model=RunModel(2))
    sink.shown_in(view)
    assert entry.model is view.model
    report = Message(Reports(0), rank=0, blob=json.dumps([{"step": 1, "metrics": {"loss": 0.5}}]).encode())
    sink.message(report)
    assert view.model.reports == 0  # what the view folds, the record does not fold again
    view.model.apply(report)
    sink.close(None)
    assert "loss 0.5" in entry.summary and entry.outcome == "finished"


def test_a_run_no_one_watched_keeps_its_value_for_the_next_cell(tmp_path, monkeypatch):
    """A real kernel runs a cell whose output no one reads (as with its notebook's tab closed);
    a later cell gets the run's record and rank 0's value; and the kernel serves that record at
    its endpoint (the Horovod panel's), named by its kernel id in the runtime folder of the
    server that started it: the folder of its connection file, which ``jupyter lab
    --ServerApp.runtime_dir=...`` makes another than the kernel's own default."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "the-kernels-default"))
    server_runtime = tmp_path / "runtime"
    server_runtime.mkdir()
    kernel_id = uuid.uuid4().hex  # a Jupyter server names a kernel's connection file kernel-<its id>.json
    manager = KernelManager(
        kernel_name="python3", connection_file=str(server_runtime / f"kernel-{kernel_id}.json")
    )
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    kernel = Kernel(manager, client)
    try:
        client.wait_for_ready(timeout=120)
        assert kernel.run("%load_ext hvd_magic").status == "ok"
        sent = client.execute("%%horovod np=-2\n" + REPORTING)  # nothing reads what it shows
        assert reply_to(client, sent, timeout=300)["content"]["status"] == "ok"
        last = kernel.run("%horovod last")
        assert last.value == "42"
        assert "loss 0.25" in "".join(last.shown) and "finished" in "".join(last.shown)
        runs = KernelRuns(endpoint_folder(server_runtime))  # where the server looks
        try:
            assert set(runs.endpoints({kernel_id, "another"})) == {kernel_id}
            listed = asyncio.run(runs.overview({kernel_id}, {}))["runs"]
        finally:
            runs.close()
        assert [(run["id"], run["state"], run["value"]) for run in listed] == [
            (f"{kernel_id}/1", "ended", "42")
        ]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
