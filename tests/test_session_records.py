"""What a live session's cells leave behind, on one real local session (Gloo, Horovod started
with its dynamic timeline) shared by the module: each cell's own Horovod Timeline (timeline=),
its own TensorBoard run folder (logdir=), and a live view in which the ranks a cell does not
run on (rank=, ranks=) are shown as not in it, not as done."""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from hvd_magic.options import RunOptions
from hvd_magic.protocol import Message
from hvd_magic.session import commands as sessions
from hvd_magic.session import live
from hvd_magic.timeline import analyze, read
from hvd_magic.widgets.render import grid_html
from hvd_magic.widgets.state import RunModel

from .helpers import leftover_processes
from .test_sinks_tensorboard import read_scalars, same_points

ALLREDUCES = "import torch\nfor _ in range(3):\n    hvd.allreduce(torch.ones(4), name={name!r})\n"


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    """One session for the module: starting ranks and Horovod costs seconds, a cell milliseconds."""
    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext hvd_magic")
    ip.run_line_magic("horovod", "start np=-2 launcher=gloo timeline=yes")
    yield ip
    sessions.stop()
    assert leftover_processes() == []


def test_each_cell_with_timeline_records_its_own_collectives(shell: InteractiveShell, tmp_path: Path) -> None:
    paths = {name: tmp_path / f"{name}.json" for name in ("first", "second")}
    with capture_output() as shown:
        shell.run_cell_magic("horovod", f"timeline={paths['first']}", ALLREDUCES.format(name="first"))
    shell.run_cell_magic("horovod", "", ALLREDUCES.format(name="between"))  # recorded by no one
    shell.run_cell_magic("horovod", f"timeline={paths['second']}", ALLREDUCES.format(name="second"))
    for name, path in paths.items():
        events = json.loads(path.read_text())  # strict JSON: whole, its "]" and all
        timeline = read(path)
        assert len(timeline) == len(events) and not timeline.truncated
        assert set(timeline.tensors.values()) == {f"allreduce.{name}"}  # this cell's, and only its
        assert analyze(timeline).per_activity.loc["ALLREDUCE", "count"] == 3
    summary = shown.outputs[0].data["text/plain"]  # shown under the cell, as a cold run's is
    assert summary == f"{paths['first']}: {len(read(paths['first'])):,} events"
    assert any(output.data["text/plain"].startswith("Horovod Timeline: ") for output in shown.outputs)


def test_timeline_is_refused_where_it_cannot_be_recorded(shell: InteractiveShell, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="recorded by rank 0"):
        shell.run_cell_magic("horovod", f"rank=1 timeline={tmp_path / 't.json'}", "1")
    plain = types.SimpleNamespace(options=RunOptions(np=-2), timeline=False)
    assert "%horovod start ... timeline=yes" in (sessions.timeline_refusal(plain, None) or "")
    with pytest.raises(UsageError, match="timeline=yes readies the ranks"):
        sessions.timeline_ready("/tmp/x.json", RunOptions(np=-2))


REPORTS = """
import random, hvd_magic
rng = random.Random(hvd.rank() + {seed})
sent = [(step, rng.random()) for step in range(1, 4)]
for step, loss in sent:
    hvd_magic.report(step=step, total=3, loss=loss)
hvd.allgather_object(sent)
"""


def test_each_cell_with_logdir_is_a_tensorboard_run_of_its_own(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    sent = [shell.run_cell_magic("horovod", f"logdir={logs}", REPORTS.format(seed=seed)) for seed in (0, 10)]
    folders = sorted(logs.iterdir())
    assert len(folders) == 2  # one run folder per cell
    for folder, per_rank in zip(folders, sent, strict=True):
        scalars = read_scalars(folder)
        for rank, points in enumerate(per_rank):
            assert same_points(scalars[f"loss/rank_{rank}"], [tuple(point) for point in points])
        assert [step for step, _ in scalars["loss"]] == [1, 2, 3]  # the mean across ranks at each step


class ModelView:
    """The live view's model, fed as the widgets' view feeds it (no widgets)."""

    def __init__(self, ranks: int) -> None:
        self.model = RunModel(ranks)

    def notice(self, text: str) -> None:
        self.model.notices.append(text)

    def message(self, message: Message) -> None:
        self.model.apply(message)

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_ranks_a_cell_does_not_run_on_are_shown_as_not_in_it(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    views: list[ModelView] = []

    def make_view(ranks: int) -> ModelView:
        views.append(ModelView(ranks))
        return views[-1]

    monkeypatch.setattr(live, "make_view", make_view)
    assert shell.run_cell_magic("horovod", "rank=1", "hvd.rank()") == 1
    assert shell.run_cell_magic("horovod", "", "hvd.rank()") == 0
    some, every = (view.model for view in views)
    assert [progress.state for progress in some.progress] == ["skipped", "done"]
    assert some.counts()["skipped"] == 1 and some.counts()["done"] == 1
    assert "not in this cell" in grid_html(some) and "1 skipped" in some.summary()
    assert [progress.state for progress in every.progress] == ["done", "done"]  # the next cell: both


def test_the_python_session_takes_a_calls_timeline_and_logdir(tmp_path: Path) -> None:
    """hvd_magic.Session: timeline=True at start, then timeline= and logdir= per call, as a
    session cell has them; what cannot be recorded is refused with the magic's reasons."""
    from hvd_magic import Session

    others = set(leftover_processes(settle=0))  # the module's own session's ranks, when it runs

    # nested: pickled by value, as a notebook's functions are
    def allreduces(name: str) -> int:
        import horovod.torch as hvd
        import torch

        for _ in range(3):
            hvd.allreduce(torch.ones(4), name=name)
        return hvd.rank()

    def reports(seed: int) -> list[tuple[int, float]]:
        import random

        import horovod.torch as hvd

        import hvd_magic

        rng = random.Random(hvd.rank() + seed)
        sent = [(step, rng.random()) for step in range(1, 4)]
        for step, loss in sent:
            hvd_magic.report(step=step, total=3, loss=loss)
        return hvd.allgather_object(sent)

    with pytest.raises(ValueError, match="backend=torch ranks run torch.distributed"):
        Session(np=-2, backend="torch", timeline=True)  # refused before any rank starts
    with Session(np=-2, launcher="gloo", timeline=True) as session:
        path, logs = tmp_path / "call.json", tmp_path / "logs"
        assert session.run(allreduces, timeline=str(path), name="in_the_call") == 0
        timeline = read(path)
        assert len(timeline) == len(json.loads(path.read_text())) and not timeline.truncated
        assert set(timeline.tensors.values()) == {"allreduce.in_the_call"}
        sent = session.run(reports, logdir=str(logs), seed=5)
        (folder,) = logs.iterdir()
        scalars = read_scalars(folder)
        for rank, points in enumerate(sent):
            assert same_points(scalars[f"loss/rank_{rank}"], [tuple(point) for point in points])
        with pytest.raises(ValueError, match="recorded by rank 0"):
            session.run(allreduces, ranks=[1], timeline=str(tmp_path / "no.json"), name="x")
    with Session(np=-2, launcher="gloo") as plain, pytest.raises(ValueError, match="timeline=yes"):
        plain.run(allreduces, timeline=str(tmp_path / "no.json"), name="x")
    assert set(leftover_processes()) <= others
