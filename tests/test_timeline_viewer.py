"""The viewer widget's columns (hvd_magic.timeline.viewer) for a real timeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from hvd_magic.timeline import read, spans

from .timeline_fixtures import real_timelines, write_events

__all__ = ["real_timelines"]  # a fixture, used by name


def test_viewer_columns_are_sorted_by_row_then_start(real_timelines: dict[str, Path]) -> None:
    from hvd_magic.timeline.viewer import TimelineViewer

    timeline = read(real_timelines["mpi"])
    viewer = TimelineViewer.from_timeline(timeline)
    starts = np.frombuffer(viewer.starts, np.float64)
    rows = np.frombuffer(viewer.rows, np.int32)
    durations = np.frombuffer(viewer.durations, np.float32)
    assert len(starts) == len(rows) == len(durations) == len(spans(timeline))
    assert (np.diff(rows) >= 0).all()
    for row in np.unique(rows):
        assert (np.diff(starts[rows == row]) >= 0).all()
    assert viewer.row_names == sorted(timeline.tensors.values())
    assert starts.min() == 0 and viewer.end_us >= (starts + durations).max() - 1


def test_more_than_255_activities_keep_their_own_names(tmp_path: Path) -> None:
    """Kinds travel as 16 bits: the 300th activity is not shown as the 256th."""
    from hvd_magic.timeline.viewer import TimelineViewer

    events: list[dict[str, object]] = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "t"}}]
    for index in range(300):
        events += [
            {"ph": "B", "name": f"ACTIVITY_{index:03d}", "ts": 10 * index, "pid": 1},
            {"ph": "E", "ts": 10 * index + 5, "pid": 1},
        ]
    viewer = TimelineViewer.from_timeline(read(write_events(tmp_path / "many.json", events)))
    kinds = np.frombuffer(viewer.kinds, np.uint16)
    starts = np.frombuffer(viewer.starts, np.float64)
    shown = [viewer.activity_names[kind] for kind in kinds[np.argsort(starts)]]
    assert shown == [f"ACTIVITY_{index:03d}" for index in range(300)]


def test_the_viewer_says_what_it_shows_where_no_widget_is_drawn(real_timelines: dict[str, Path]) -> None:
    """Its text form (a terminal, a headless run, an export without the widget) is a summary,
    not ``<TimelineViewer object at 0x...>``."""
    from hvd_magic.timeline.viewer import TimelineViewer

    timeline = read(real_timelines["mpi"])
    viewer = TimelineViewer.from_timeline(timeline)
    data, _ = viewer._repr_mimebundle_()
    tensors = len(timeline.tensors)
    assert data["text/plain"].startswith(
        f"Horovod Timeline viewer: {tensors} tensors, {len(timeline.store):,} spans"
    )
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == viewer.model_id


def test_the_live_timeline_leaves_neither_widget_nor_text_when_the_run_ends(
    ip: InteractiveShell, real_timelines: dict[str, Path]
) -> None:
    """The viewer shown while the run writes its timeline is closed when the run ends (the
    final one takes its place): it leaves the kernel and the saved notebook's widget state, and
    its output and the analysis so far are emptied, with no "<... object>" text left behind."""
    from hvd_magic.timeline.live import REFRESH_SECONDS, LiveTimeline

    now = [0.0]
    live = LiveTimeline(str(real_timelines["gloo"]), written=lambda: True, clock=lambda: now[0])
    with capture_output() as packed:
        now[0] = REFRESH_SECONDS
        assert live.tick()
        viewer, analysis = (output.data for output in packed.outputs)
        assert viewer["text/plain"].startswith("Horovod Timeline viewer: ")
        assert "events so far" in analysis["text/plain"] and "Horovod Timeline: " in analysis["text/plain"]
        live.close()
    emptied = packed.outputs[2:]
    assert [(output.data, output.update) for output in emptied] == [({"text/html": ""}, True)] * 2
    assert live.viewer.comm is None and live.viewer.layout.comm is None
