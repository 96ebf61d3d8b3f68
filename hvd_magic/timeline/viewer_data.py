"""What the timeline viewer's front end (``js/src/viewer.ts``) is sent of a timeline, apart from
any widget: the traits it draws (every span, or an overview of a large timeline) and the detail
of a window it asks for. The notebook's widget (``timeline.viewer``) and the Horovod panel's tab
(``run.endpoint``, over the Jupyter server) send the same, to the same JavaScript.

Marks travel as binary columns (about 22 bytes a mark), sorted by tensor row and start, so the
front end can binary-search the visible window. A timeline of up to ``DIRECT_SPANS`` spans goes
over whole, once. A larger one goes over as an overview (narrow spans merged per pixel,
``detail.window``), and the front end asks for the detail of each window it shows
(``{"type": "window", ...}``): what crosses to the browser is bounded by the screen, not the file.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hvd_magic.timeline.detail import Marks, no_marks, window
from hvd_magic.timeline.levels import build_levels
from hvd_magic.timeline.matching import release_memory
from hvd_magic.timeline.store import SpanStore

__all__ = ["ViewerData", "window_request"]

DIRECT_SPANS = 200_000  # up to this many spans, all of them go to the browser at once
OVERVIEW_MARKS = 300_000  # about what the overview may hold (6.6 MB)
DETAIL_SPANS = 150_000  # a window with more spans than this is merged per pixel
MAX_WIDTH = 8_000  # pixels a request may ask for
LEVEL_ITEMS = 100_000  # the coarsest level of detail holds about this many items
_NONE = no_marks()


class ViewerData:
    """One viewer's data: ``show`` a store (again when a growing file's store is newer), answer
    its window requests."""

    def __init__(self) -> None:
        self.activity_names: list[str] = []  # an activity keeps its index (colour, checkbox) across shows
        self.end_us = 0.0
        self.store: SpanStore | None = None

    def show(self, store: SpanStore, width: int = 1600) -> dict[str, Any]:
        """The viewer's traits for ``store``, ``starts`` last (the front end reloads on it)."""
        # coarser copies answer wide windows with a few items per pixel (the overview is one);
        # built first, so that a failure leaves the shown store and its levels together
        lod = len(store) > DIRECT_SPANS
        levels = build_levels(store, LEVEL_ITEMS) if lod else []
        self.store, self._levels = store, levels
        self._origin = store.first_start
        end = store.last_end if len(store) else self._origin + 1
        rows = list(range(len(store.row_names)))
        pixels = int(np.clip(OVERVIEW_MARKS // max(3 * len(rows), 1), 50, width))
        names = self.activity_names + sorted(set(store.kind_names) - set(self.activity_names))
        position = {name: i for i, name in enumerate(names)}
        self._kind_map = np.array([position[n] for n in store.kind_names] or [0], np.uint16)
        limit = 0 if lod else len(store)
        marks = window(store, self._origin, end, pixels, rows, limit, self._origin, self._levels)
        release_memory()  # what building the levels freed
        self.activity_names, self.end_us = names, float(end - self._origin)
        starts, durations, mark_rows, kinds, depths, counts = self._mapped(marks).buffers()
        return {
            "row_names": store.row_names,
            "activity_names": names,
            "rows": mark_rows,
            "durations": durations,
            "kinds": kinds,
            "depths": depths,
            "counts": counts if lod else b"",
            "cycles": (store.cycles.astype(np.float64) - self._origin).tobytes(),
            "end_us": self.end_us,
            "lod": lod,
            "starts": starts,
        }

    def _mapped(self, marks: Marks) -> Marks:
        marks.kind = self._kind_map[marks.kind]
        return marks

    def detail(self, t0: float, t1: float, width: int, rows: list[int]) -> tuple[dict[str, Any], Marks]:
        """The reply to a window request (times relative to the timeline's start): the marks of
        ``rows`` for the window widened by half its length on each side, so that panning by up
        to half a window needs no new request."""
        assert self.store is not None, "show a store first"
        margin = max(t1 - t0, 1.0) / 2
        low, high = t0 - margin, t1 + margin
        marks = window(
            self.store, int(self._origin + low), int(self._origin + high) + 1, 2 * width, rows,
            DETAIL_SPANS, self._origin, self._levels,
        )  # fmt: skip
        return {"type": "spans", "t0": low, "t1": high, "rows": rows}, self._mapped(marks)

    def answer(self, content: object) -> tuple[dict[str, Any], list[bytes]] | None:
        """The reply to the front end's message (its content and buffers), None when the message
        is not a window request. A malformed one (rows of an overview replaced meanwhile) gets an
        empty reply: the front end keeps one request in flight and waits for it."""
        if not isinstance(content, dict) or content.get("type") != "window" or self.store is None:
            return None
        request = window_request(content, len(self.store.row_names), self.end_us)
        began = time.perf_counter()
        reply, marks = {"type": "spans", "t0": 0, "t1": 0, "rows": []}, _NONE
        if request is not None:
            reply, marks = self.detail(*request)
        fields, buffers = marks.packed(request[3] if request is not None else [])
        kernel_ms = round(1000 * (time.perf_counter() - began), 1)  # what the front end reports
        return {**reply, **fields, "id": content.get("id"), "kernel_ms": kernel_ms}, buffers


def window_request(
    content: dict[str, Any], row_count: int, end_us: float
) -> tuple[float, float, int, list[int]] | None:
    """(t0, t1, width, rows) of a well-formed ``window`` message (times clipped to the run
    give or take its length), else None."""
    try:
        t0, t1, width = float(content["t0"]), float(content["t1"]), int(content["width"])
        rows = sorted({int(r) for r in content["rows"]})
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    t0, t1 = (min(max(t, -end_us), 2 * end_us) for t in (t0, t1))
    if not t0 < t1 or not 0 < width <= MAX_WIDTH or any(not 0 <= r < row_count for r in rows):
        return None
    return t0, t1, width, rows
