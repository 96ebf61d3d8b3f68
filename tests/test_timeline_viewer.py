"""The viewer widget's columns (hvd_magic.timeline.viewer) for a real timeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
