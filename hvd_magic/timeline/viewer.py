"""The interactive timeline viewer: a Python widget (anywidget) over the bundled ES module.

Marks travel to the browser as binary columns (about 22 bytes a mark), sorted by tensor row and
start, so the front end can binary-search the visible window. A timeline of up to
``DIRECT_SPANS`` spans goes over whole, once. A larger one goes over as an overview (narrow spans
merged per pixel, ``detail.window``), and the front end asks the kernel for the detail of each
window it shows (``{"type": "window", ...}`` messages): what crosses to the browser, and what the
saved notebook holds, is bounded by the screen, not by the file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import traitlets

from hvd_magic.errors import HorovodMagicError
from hvd_magic.timeline.detail import Marks, no_marks, window
from hvd_magic.timeline.hints import duration
from hvd_magic.timeline.levels import build_levels
from hvd_magic.timeline.matching import release_memory
from hvd_magic.timeline.reader import Timeline
from hvd_magic.timeline.store import SpanStore

__all__ = ["TimelineViewer"]

BUNDLE = Path(__file__).parent.parent / "static" / "viewer.js"
DIRECT_SPANS = 200_000  # up to this many spans, all of them go to the browser at once
OVERVIEW_MARKS = 300_000  # about what the overview may hold (6.6 MB)
DETAIL_SPANS = 150_000  # a window with more spans than this is merged per pixel
MAX_WIDTH = 8_000  # pixels a request may ask for
LEVEL_ITEMS = 100_000  # the coarsest level of detail holds about this many items
_NONE = no_marks()


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
    counts = traitlets.Bytes().tag(sync=True)  # empty: every mark is one span
    cycles = traitlets.Bytes().tag(sync=True)
    end_us = traitlets.Float().tag(sync=True)
    lod = traitlets.Bool(False).tag(sync=True)  # the kernel answers requests for a window's detail

    @classmethod
    def from_timeline(cls, timeline: Timeline, width: int = 1600) -> TimelineViewer:
        if not BUNDLE.exists():
            raise HorovodMagicError(
                f"the timeline viewer's front end is not built ({BUNDLE} is missing): run "
                "`npm ci && npm run build` in js/ (scripts/setup.sh does it)"
            )
        viewer = cls()
        viewer.show(timeline.store, width)
        viewer.on_msg(viewer._answer)
        return viewer

    def show(self, store: SpanStore, width: int = 1600) -> None:
        """Show ``store`` (also a newer one of a file still being written)."""
        # coarser copies answer wide windows with a few items per pixel (the overview is one);
        # built first, so that a failure leaves the shown store and its levels together
        lod = len(store) > DIRECT_SPANS
        levels = build_levels(store, LEVEL_ITEMS) if lod else []
        self._store, self._levels = store, levels
        self._origin = store.first_start
        end = store.last_end if len(store) else self._origin + 1
        rows = list(range(len(store.row_names)))
        pixels = int(np.clip(OVERVIEW_MARKS // max(3 * len(rows), 1), 50, width))
        # a newer store of a growing file: activities keep their index (the front end's
        # checkboxes and colours), new ones come after them
        names = list(self.activity_names) + sorted(set(store.kind_names) - set(self.activity_names))
        position = {name: i for i, name in enumerate(names)}
        self._kind_map = np.array([position[n] for n in store.kind_names] or [0], np.uint16)
        limit = 0 if lod else len(store)
        marks = window(store, self._origin, end, pixels, rows, limit, self._origin, self._levels)
        release_memory()  # what building the levels freed
        with self.hold_sync():
            self.row_names = store.row_names
            self.activity_names = names
            self._set_marks(self._mapped(marks), counted=lod)
            self.cycles = (store.cycles.astype(np.float64) - self._origin).tobytes()
            self.end_us = float(end - self._origin)
            self.lod = lod

    def _mapped(self, marks: Marks) -> Marks:
        marks.kind = self._kind_map[marks.kind]
        return marks

    def _set_marks(self, marks: Marks, counted: bool) -> None:
        starts, durations, rows, kinds, depths, counts = marks.buffers()
        self.rows, self.durations, self.kinds, self.depths = rows, durations, kinds, depths
        self.counts = counts if counted else b""
        self.starts = starts  # last: the front end reloads on this change

    def detail(self, t0: float, t1: float, width: int, rows: list[int]) -> tuple[dict[str, Any], Marks]:
        """The reply to a window request (times relative to the timeline's start): the marks of
        ``rows`` for the window widened by half its length on each side, so that panning by up
        to half a window needs no new request."""
        margin = max(t1 - t0, 1.0) / 2
        low, high = t0 - margin, t1 + margin
        marks = window(
            self._store, int(self._origin + low), int(self._origin + high) + 1, 2 * width, rows,
            DETAIL_SPANS, self._origin, self._levels,
        )  # fmt: skip
        return {"type": "spans", "t0": low, "t1": high, "rows": rows}, self._mapped(marks)

    def _answer(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict) or content.get("type") != "window":
            return  # not ours
        request = _window_request(content, len(self._store.row_names), self.end_us)
        # a malformed request (rows of an overview replaced meanwhile) gets an empty reply: the
        # front end keeps one request in flight and waits for it
        began = time.perf_counter()
        reply, marks = {"type": "spans", "t0": 0, "t1": 0, "rows": []}, _NONE
        if request is not None:
            reply, marks = self.detail(*request)
        fields, buffers = marks.packed(request[3] if request is not None else [])
        kernel_ms = round(1000 * (time.perf_counter() - began), 1)  # what the front end reports
        self.send({**reply, **fields, "id": content.get("id"), "kernel_ms": kernel_ms}, buffers=buffers)

    def summary(self) -> str:
        """One line on what the viewer shows: the text form of its display (a terminal, an
        export without the widget)."""
        spans, tensors = (len(self._store) if hasattr(self, "_store") else 0), len(self.row_names)
        return (
            f"Horovod Timeline viewer: {tensors} tensor{'s' * (tensors != 1)}, {spans:,} span"
            f"{'s' * (spans != 1)} over {duration(self.end_us)} (interactive: zoom, pan, hover)"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle[0]["text/plain"] = self.summary()  # not <TimelineViewer object at 0x...>
        return bundle


def _window_request(
    content: dict[str, Any], row_count: int, end_us: float
) -> tuple[float, float, int, list[int]] | None:
    """(t0, t1, width, rows) of a well-formed ``window`` message (times clipped to the run
    give or take its length), else None."""
    try:
        t0, t1, width = float(content["t0"]), float(content["t1"]), int(content["width"])
        rows = sorted({int(r) for r in content["rows"]})
    except (KeyError, TypeError, ValueError):
        return None
    t0, t1 = (min(max(t, -end_us), 2 * end_us) for t in (t0, t1))
    if not t0 < t1 or not 0 < width <= MAX_WIDTH or any(not 0 <= r < row_count for r in rows):
        return None
    return t0, t1, width, rows
