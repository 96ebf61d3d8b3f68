"""The interactive timeline viewer: a Python widget (anywidget) over the bundled ES module.

What it sends the front end, the traits and the detail of each window the front end asks for
(``{"type": "window", ...}`` messages), is made by ``timeline.viewer_data`` (the Horovod panel's
tab sends the same); what the saved notebook holds is bounded by the screen, not by the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from hvd_magic.errors import HorovodMagicError
from hvd_magic.timeline.detail import Marks
from hvd_magic.timeline.hints import duration
from hvd_magic.timeline.reader import Timeline
from hvd_magic.timeline.store import SpanStore
from hvd_magic.timeline.viewer_data import ViewerData

__all__ = ["BUNDLE", "TimelineViewer"]

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
    counts = traitlets.Bytes().tag(sync=True)  # empty: every mark is one span
    cycles = traitlets.Bytes().tag(sync=True)
    end_us = traitlets.Float().tag(sync=True)
    lod = traitlets.Bool(False).tag(sync=True)  # the kernel answers requests for a window's detail

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data = ViewerData()

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
        traits = self.data.show(store, width)
        with self.hold_sync():
            for name, value in traits.items():  # starts last: the front end reloads on it
                setattr(self, name, value)

    def detail(self, t0: float, t1: float, width: int, rows: list[int]) -> tuple[dict[str, Any], Marks]:
        """The reply to a window request (``ViewerData.detail``)."""
        return self.data.detail(t0, t1, width, rows)

    def _answer(self, _widget: Any, content: Any, _buffers: Any) -> None:
        reply = self.data.answer(content)
        if reply is not None:  # else not ours
            self.send(reply[0], buffers=reply[1])

    def summary(self) -> str:
        """One line on what the viewer shows: the text form of its display (a terminal, an
        export without the widget)."""
        store = self.data.store
        spans, tensors = (len(store) if store is not None else 0), len(self.row_names)
        return (
            f"Horovod Timeline viewer: {tensors} tensor{'s' * (tensors != 1)}, {spans:,} span"
            f"{'s' * (spans != 1)} over {duration(self.end_us)} (interactive: zoom, pan, hover)"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle[0]["text/plain"] = self.summary()  # not <TimelineViewer object at 0x...>
        return bundle
