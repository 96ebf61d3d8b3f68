"""A run's Horovod Timeline as the Horovod panel's tab is sent it (issue 78): the file read as the
run writes it (``timeline.live.Growing``, the new bytes only), made into the data the notebook's
viewer gets (``timeline.viewer_data``), for the same JavaScript; binary columns go as base64 in
the JSON the endpoint answers. Asked only from the endpoint's serving thread."""

from __future__ import annotations

import base64
import os
import time
from typing import Any

from hvd_magic.errors import TimelineError
from hvd_magic.timeline.live import REFRESH_SECONDS, Growing
from hvd_magic.timeline.reader import read
from hvd_magic.timeline.store import SpanStore
from hvd_magic.timeline.viewer_data import ViewerData

__all__ = ["ServedTimeline"]


class ServedTimeline:
    """The timeline at ``path`` that a run began writing at ``since`` (``time.time()``); a file
    older than that is an earlier run's, and not shown."""

    def __init__(self, path: str, since: float) -> None:
        self.path, self.since = path, since
        self.growing = Growing(path)
        self.data = ViewerData()
        self.version = 0  # how many times the traits changed
        self.traits: dict[str, Any] | None = None
        self.said = "no timeline yet: the run has not begun writing it"
        self.spans = 0
        self.read_whole = False
        self.next_read = 0.0  # time.monotonic(): a growing file is read as often as under the cell

    def answer(self, request: dict[str, Any], ended: bool) -> dict[str, Any]:
        """The traits when newer than the ``version`` the tab has, or the detail of the
        ``window`` it asks for."""
        if isinstance(window := request.get("window"), dict):
            reply = self.data.answer(window) if self.traits is not None else None
            if reply is None:
                return {"refused": "not a window request of a timeline shown"}
            return {"reply": reply[0], "buffers": [_text(buffer) for buffer in reply[1]]}
        self._update(ended)
        answer: dict[str, Any] = {"version": self.version, "said": self.said}
        if self.traits is not None and request.get("version") != self.version:
            answer["traits"] = {k: _text(v) if isinstance(v, bytes) else v for k, v in self.traits.items()}
            answer["binary"] = [k for k, v in self.traits.items() if isinstance(v, bytes)]
        return answer

    def _update(self, ended: bool) -> None:
        if not ended and time.monotonic() < self.next_read:
            return
        self.next_read = time.monotonic() + REFRESH_SECONDS
        try:
            if os.path.getmtime(self.path) < self.since - 1:
                return  # an earlier run's file: this run has not written yet
        except OSError:
            self.said = f"no timeline yet at {self.path}" + (" (the run wrote none)" if ended else "")
            return
        try:
            store = self._newer(ended)
            if store is not None:
                self.traits, self.version, self.spans = self.data.show(store), self.version + 1, len(store)
        except Exception as err:  # noqa: BLE001 - as under the cell: a timeline's view never fails the panel
            self.growing.broken, self.said = True, f"{self.path} cannot be shown: {type(err).__name__}: {err}"
            return
        if self.traits is not None:
            so_far = "" if ended else " so far (the run is still writing it)"
            self.said = f"{self.path}: {self.spans:,} spans{so_far}"

    def _newer(self, ended: bool) -> SpanStore | None:
        """The spans written since the last look, all of them; None when there are none new."""
        if self.growing.broken:  # not plain Horovod output, or no scanner: the tolerant reader
            if not ended or self.read_whole:  # ... once, at the end
                return None
            self.read_whole = True
            try:
                return read(self.path).store
            except TimelineError as err:
                self.said = str(err)
                return None
        timeline = self.growing.update()
        return timeline.store if timeline is not None and len(timeline.store) else None


def _text(buffer: bytes) -> str:
    return base64.b64encode(buffer).decode("ascii")
