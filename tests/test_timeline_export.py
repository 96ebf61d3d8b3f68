"""A time slice of a real timeline (hvd_magic.timeline.export), as chrome://tracing reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvd_magic.timeline import export_slice, read, spans
from hvd_magic.timeline.export import OPENED

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
    kept = [e for e in events if e.get("name") != BEFORE and e.get("args", {}).get("hvd_magic") != OPENED]
    assert _fields(kept[: len(wanted)]) == _fields(wanted)
    assert all(e["ph"] == "E" and e["ts"] == end for e in kept[len(wanted) :])
    assert all(e["ph"] == "B" and e["ts"] == start for e in events if e.get("name") == BEFORE)


def test_a_span_that_covers_the_slice_or_began_before_it_is_drawn_in_it(tmp_path: Path) -> None:
    """Only events inside the window were kept: a span from before it to after it had neither,
    and vanished (an outer span around an inner one too)."""
    trace = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad.a"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "grad.b"}},
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "ts": 0, "pid": 1},
        {"name": "ALLREDUCE", "ph": "B", "ts": 10, "pid": 2},
        {"name": "MPI_ALLREDUCE", "ph": "B", "ts": 40, "pid": 2},
        {"ph": "E", "ts": 60, "pid": 2},
        {"ph": "E", "ts": 1000, "pid": 2},
        {"ph": "E", "ts": 1000, "pid": 1},
    ]
    source = tmp_path / "timeline.json"
    source.write_text(json.dumps(trace))
    expected = {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"}  # open at each window's start
    for window in [(100, 200), (30, 70)]:
        out = tmp_path / f"slice-{window[0]}.json"
        export_slice(read(source), out, *window)
        events = json.loads(out.read_text())
        opened = {e["name"] for e in events if e.get("args", {}).get("hvd_magic") == OPENED}
        assert opened == expected and all(e["ts"] == window[0] for e in events if e.get("name") in opened)
        drawn = spans(read(out))
        assert expected <= set(drawn["name"].astype(str)) and BEFORE not in set(drawn["name"].astype(str))
    assert "MPI_ALLREDUCE" in set(drawn["name"].astype(str))  # the inner span, whole in the last window


def _fields(events: list[dict[str, Any]]) -> list[list[Any]]:
    return [[event.get(key) for key in ("ph", "name", "ts", "pid")] for event in events]
