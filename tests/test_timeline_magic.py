"""Timelines through the magics: %horovod_timeline shows one, %%horovod timeline=... records one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from hvd_magic.timeline import analyze, read

from .timeline_fixtures import TRAIN, real_timelines

__all__ = ["real_timelines"]  # a fixture, used by name

WIDGET = "application/vnd.jupyter.widget-view+json"


def test_timeline_magic_shows_analysis_and_refuses_missing_files(
    ip: InteractiveShell, real_timelines: dict[str, Path]
) -> None:
    path = real_timelines["mpi"]
    with capture_output() as packed:
        ip.run_line_magic("horovod_timeline", str(path))
    timeline = read(path)
    summary, viewer, analysis = (output.data for output in packed.outputs)
    assert f"{path}: {len(timeline):,} events" in summary["text/html"]
    assert len(timeline) == len(json.loads(path.read_text()))
    assert WIDGET in viewer  # the interactive viewer
    # each with a text form that says what it shows (not "<... object at 0x...>")
    assert summary["text/plain"] == f"{path}: {len(timeline):,} events"
    assert viewer["text/plain"].startswith(f"Horovod Timeline viewer: {len(timeline.tensors)} tensors")
    text = analysis["text/plain"]
    assert text.startswith("Horovod Timeline: ") and "communication" in text
    assert analyze(timeline).to_html() in analysis["text/html"]  # the tables, as analyze() makes them
    assert "time per activity" in analysis["text/html"] and "allreduce.weight" in analysis["text/html"]
    with pytest.raises(UsageError, match="no such file"):
        ip.run_line_magic("horovod_timeline", "/nonexistent/timeline.json")
    with pytest.raises(UsageError, match="folder .* does not exist"):
        ip.run_cell_magic("horovod", "np=-2 timeline=/nonexistent/x.json", "1")


def test_timeline_magic_says_when_a_file_was_cut_off(
    ip: InteractiveShell, real_timelines: dict[str, Path], tmp_path: Path
) -> None:
    data = real_timelines["mpi"].read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: data.rindex(b'"ts"')])  # cut inside the last event
    with capture_output() as packed:
        ip.run_line_magic("horovod_timeline", str(cut))
    summary = packed.outputs[0].data["text/html"]
    assert f"{len(read(cut)):,} events" in summary and "cut off mid-event" in summary


def test_timeline_on_writes_next_to_the_notebook(
    ip: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    check_cycles_timeline(ip, tmp_path)


@pytest.mark.slow
def test_timeline_on_is_whole_twenty_times_in_a_row(
    ip: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run that once left a "]" mid-file, repeated (``pytest -m slow``)."""
    for attempt in range(20):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        monkeypatch.chdir(folder)
        check_cycles_timeline(ip, folder)


def check_cycles_timeline(ip: InteractiveShell, folder: Path) -> None:
    ip.run_cell_magic("horovod", "np=-2 timeline=cycles", TRAIN)
    (written,) = folder.glob("horovod_timeline-*.json")
    events = json.loads(written.read_text())  # strict JSON: whole, "]" and all
    timeline = read(written)
    assert len(timeline) == len(events)
    marks = [e for e in events if e.get("name") == "CYCLE_START"]
    analysis = analyze(timeline)
    assert analysis.cycles == len(marks) > 0  # cycles=on marks them
    assert 0 < analysis.cycles - analysis.idle_cycles <= analysis.per_activity.loc["ALLREDUCE", "count"]
