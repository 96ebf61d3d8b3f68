"""A time slice of a real timeline (hvd_magic.timeline.export), as chrome://tracing reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvd_magic.timeline import export_slice, read, spans

from .timeline_fixtures import real_timelines

__all__ = ["real_timelines"]  # a fixture, used by name

BEFORE = "(before the slice)"


def test_export_slice_opens_as_chrome_trace(real_timelines: dict[str, Path], tmp_path: Path) -> None:
    timeline = read(real_timelines["mpi"])
    frame = spans(timeline)
    start, end = int(frame["start"].quantile(0.3)), int(frame["start"].quantile(0.7))
    out = tmp_path / "slice.json"
    written = export_slice(timeline, out, start, end)
    events = json.loads(out.read_text())
    assert len(events) == written > 0
    assert all(start <= e["ts"] <= end for e in events if e["ph"] != "M")
    for pid in {e.get("pid") for e in events if e["ph"] in "BE"}:
        phases = [e["ph"] for e in events if e.get("pid") == pid and e["ph"] in "BE"]
        assert phases.count("B") == phases.count("E")
    # Every event of the window, and all metadata, in file order; then the spans closed at the end.
    original = json.loads(real_timelines["mpi"].read_text())
    wanted = [e for e in original if e["ph"] == "M" or start <= e.get("ts", start - 1) <= end]
    kept = [e for e in events if e.get("name") != BEFORE]
    assert _fields(kept[: len(wanted)]) == _fields(wanted)
    assert all(e["ph"] == "E" and e["ts"] == end for e in kept[len(wanted) :])
    assert all(e["ph"] == "B" and e["ts"] == start for e in events if e.get("name") == BEFORE)


def _fields(events: list[dict[str, Any]]) -> list[list[Any]]:
    return [[event.get(key) for key in ("ph", "name", "ts", "pid")] for event in events]
