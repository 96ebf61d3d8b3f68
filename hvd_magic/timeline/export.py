"""Write a time slice of a timeline as a file chrome://tracing and Perfetto open."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc

from hvd_magic.timeline.reader import Timeline

__all__ = ["OPENED", "export_slice"]

OPENED = "opened at the slice's start"  # a span that began before the slice


def export_slice(timeline: Timeline, path: str | Path, start_us: int, end_us: int) -> int:
    """Events with ``start_us <= ts <= end_us`` plus all metadata; returns how many were written.

    Spans cut by the window are opened and closed at its edges, so the viewer draws them: one that
    began before it (its name, marked ``"args": {"hvd_magic": OPENED}``), or still open at its end.
    """
    before = timeline.spans()
    before = before[(before["start"] < start_us) & (before["end"] >= start_us)].sort_values(["pid", "depth"])
    out: list[dict[str, object]] = []
    open_spans: dict[object, int] = {}
    for pid, name in zip(before["pid"].tolist(), before["name"].astype(str).tolist(), strict=True):
        out.append({"ph": "B", "name": name, "ts": start_us, "pid": pid, "args": {"hvd_magic": OPENED}})
        open_spans[pid] = open_spans.get(pid, 0) + 1
    events = timeline.events
    ts = events["ts"]
    inside = pc.and_(pc.greater_equal(ts, start_us), pc.less_equal(ts, end_us))
    meta = pc.equal(events["ph"].cast("string"), "M")
    rows = events.filter(pc.or_(pc.fill_null(inside, False), meta)).to_pylist()
    for row in rows:
        event = {k: v for k, v in row.items() if v is not None}
        if event.get("args"):
            event["args"] = {k: v for k, v in event["args"].items() if v is not None}
        pid = event.get("pid")
        if event["ph"] == "B":
            open_spans[pid] = open_spans.get(pid, 0) + 1
        elif event["ph"] == "E":
            if not open_spans.get(pid):
                out.append({"ph": "B", "name": "(before the slice)", "ts": start_us, "pid": pid})
            else:
                open_spans[pid] -= 1
        out.append(event)
    for pid, depth in open_spans.items():
        out.extend({"ph": "E", "ts": end_us, "pid": pid} for _ in range(depth))
    Path(path).write_text(json.dumps(out))
    return len(out)
