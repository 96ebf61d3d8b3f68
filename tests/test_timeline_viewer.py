"""The viewer widget's columns (hvd_magic.timeline.viewer) for a real timeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hvd_magic.timeline import read, spans

from .timeline_fixtures import real_timelines

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
