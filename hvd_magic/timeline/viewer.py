"""The interactive timeline viewer: a Python widget (anywidget) over the bundled ES module.

Spans travel to the browser as binary columns (about 20 bytes a span), sorted by tensor row
and start, so the front end can binary-search the visible window and merge sub-pixel spans.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import numpy as np
import pyarrow.compute as pc
import traitlets

from ..errors import HorovodMagicError
from .analysis import spans as make_spans
from .reader import Timeline

__all__ = ["TimelineViewer"]

BUNDLE = Path(__file__).parent.parent / "static" / "viewer.js"


class TimelineViewer(anywidget.AnyWidget):
    """Tensors as rows, activities as coloured spans; zoom, pan, hover, filter, cycle marks.

    >>> TimelineViewer.from_timeline(hvd_magic.timeline.read("timeline.json"))   # doctest: +SKIP
    """

    _esm = (
        BUNDLE
        if BUNDLE.exists()
        else "export default { render({ el }) { el.textContent = 'viewer not built' } }"
    )
    row_names = traitlets.List(traitlets.Unicode()).tag(sync=True)
    activity_names = traitlets.List(traitlets.Unicode()).tag(sync=True)
    starts = traitlets.Bytes().tag(sync=True)
    durations = traitlets.Bytes().tag(sync=True)
    rows = traitlets.Bytes().tag(sync=True)
    kinds = traitlets.Bytes().tag(sync=True)
    depths = traitlets.Bytes().tag(sync=True)
    cycles = traitlets.Bytes().tag(sync=True)
    end_us = traitlets.Float().tag(sync=True)

    @classmethod
    def from_timeline(cls, timeline: Timeline) -> TimelineViewer:
        if not BUNDLE.exists():
            raise HorovodMagicError(
                f"the timeline viewer's front end is not built ({BUNDLE} is missing): run "
                "`npm ci && npm run build` in js/ (scripts/setup.sh does it)"
            )
        frame = make_spans(timeline)
        origin = float(frame["start"].min()) if len(frame) else 0.0
        tensor_names = sorted({timeline.tensors.get(int(p), f"pid {p}") for p in frame["pid"].unique()})
        row_of = {name: i for i, name in enumerate(tensor_names)}
        activities = sorted(frame["name"].unique())
        kind_of = {name: i for i, name in enumerate(activities)}
        frame = frame.assign(
            row=frame["pid"].map(lambda p: row_of[timeline.tensors.get(int(p), f"pid {p}")]),
            kind=frame["name"].map(kind_of),
        ).sort_values(["row", "start"], kind="stable")
        events = timeline.events
        cycle_mask = pc.equal(events["name"].cast("string"), "CYCLE_START")
        cycle_ts = events.filter(pc.fill_null(cycle_mask, False))["ts"].to_numpy(zero_copy_only=False)
        return cls(
            row_names=tensor_names,
            activity_names=[str(a) for a in activities],
            starts=(frame["start"].to_numpy(np.float64) - origin).tobytes(),
            durations=frame["duration"].to_numpy(np.float32).tobytes(),
            rows=frame["row"].to_numpy(np.int32).tobytes(),
            kinds=np.minimum(frame["kind"].to_numpy(), 255).astype(np.uint8).tobytes(),
            depths=np.minimum(frame["depth"].to_numpy(), 2).astype(np.uint8).tobytes(),
            cycles=(cycle_ts.astype(np.float64) - origin).tobytes(),
            end_us=float(frame["end"].max() - origin) if len(frame) else 1.0,
        )
