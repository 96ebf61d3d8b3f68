"""A timeline while the run still writes it: read incrementally, shown and refreshed under the
cell every few seconds (``timeline=on`` in a notebook).

:class:`Growing` reads what was appended since its last call, whole events only (rank 0 streams
the file in pieces that may end inside one), and feeds them to the same matcher as ``read``:
each refresh costs the new bytes, plus a snapshot of the spans so far.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from hvd_magic.errors import TimelineError
from hvd_magic.timeline import _fast
from hvd_magic.timeline.reader import Timeline, metadata, skip_opening

__all__ = ["Growing", "LiveTimeline", "live_timeline"]

REFRESH_SECONDS = 3.0


class Growing:
    """A timeline file being written: ``update()`` returns a ``Timeline`` of the whole events
    so far when some were added since the last call, else None."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset: int | None = None  # past the opening "[", once seen
        self.carry = b""
        self.digest = _fast.Digest()
        self.broken = False  # not plain Horovod output: left to the reader after the run

    def update(self) -> Timeline | None:
        if self.broken or not os.path.exists(self.path):
            return None
        with open(self.path, "rb") as file:
            if self.offset is None:
                if not file.read(4096).strip():
                    return None  # nothing written yet
                file.seek(0)
                try:
                    self.offset = skip_opening(self.path, file)
                except TimelineError:
                    self.broken = True
                    return None
            if os.fstat(file.fileno()).st_size < self.offset:
                self.broken = True  # rewritten from the start: not a file growing
                return None
            file.seek(self.offset)
            new = file.read()
        self.offset += len(new)
        data = self.carry + new
        tail = data.rstrip()
        if tail.endswith(b"]") and tail[:-1].rstrip().endswith(b"}"):
            cut = len(tail[:-1].rstrip()) - 1  # the closing "]": the run ended, the last event is whole
        else:
            cut = data.rfind(b"},")
        if cut < 0:
            self.carry = data
            return None
        whole, self.carry = data[: cut + 1], data[cut + 1 :]
        # one non-final chunk: None when the scanner is not built or the events are not plain
        if _fast.scan([(0, memoryview(whole), False, False)], 1, self.digest) is None:
            self.broken = True
            return None
        tensors, start = metadata(self.digest.meta)
        sizes = dict(self.digest.tensor_bytes)  # the digest goes on growing
        store = self.digest.builder.finish(self.digest.names, tensors, sizes, more=True)
        return Timeline(
            self.path, self.digest.events, tensors, start, closed=False, tensor_bytes=sizes, _store=store
        )


class LiveTimeline:
    """Shows the run's timeline under the cell while it grows: the viewer (updated in place)
    and the analysis, refreshed at most every ``REFRESH_SECONDS`` (longer when a refresh itself
    takes long: never more than a fifth of the time)."""

    def __init__(
        self,
        path: str,
        written: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        threshold: int | None = None,
    ) -> None:
        self.growing = Growing(path)
        self.threshold = threshold  # the run's fusion buffer (bytes), None: as analyze decides
        self.written = written  # this run's timeline has begun arriving at ``path``
        self.clock = clock
        self.next_refresh = clock() + REFRESH_SECONDS
        self.viewer: Any = None
        self.shown: Any = None  # the display handles of the viewer and of the analysis so far
        self.analysis: Any = None

    def tick(self) -> bool:
        """Refresh when it is time; returns whether it tried (it may have taken a while)."""
        if self.growing.broken or self.clock() < self.next_refresh or not self.written():
            return False
        began = time.perf_counter()
        try:
            timeline = self.growing.update()
            if timeline is not None and len(timeline.store):
                self._show(timeline)
        except Exception:  # noqa: BLE001 - a view of the timeline must never stop the run
            # the reading after the run shows the file, or says what is wrong with it
            self.growing.broken = True
        cost = time.perf_counter() - began
        self.next_refresh = self.clock() + max(REFRESH_SECONDS, 5 * cost)
        return True

    def _show(self, timeline: Timeline) -> None:
        from IPython.display import display

        from hvd_magic.timeline.analysis import analyze
        from hvd_magic.timeline.hints import summary
        from hvd_magic.timeline.viewer import TimelineViewer

        analysis = analyze(timeline, self.threshold)
        note = f"{self.growing.path}: {len(timeline):,} events so far (the run is still writing it)"
        bundle = {
            "text/html": f"<small>{note}</small><div class='hvd-timeline'>{analysis.to_html()}</div>",
            "text/plain": f"{note}\n{summary(analysis)}",
        }
        if self.viewer is None:
            self.viewer = TimelineViewer.from_timeline(timeline)
            self.shown = display(self.viewer, display_id=True)
            self.analysis = display(bundle, raw=True, display_id=True)
        else:
            self.viewer.show(timeline.store)
            self.analysis.update(bundle, raw=True)

    def close(self) -> None:
        """The run ended: the final viewer and analysis (shown after the run) take the live
        ones' place; the live viewer is closed, so that it leaves the kernel and the saved
        notebook, and its output and the analysis so far are emptied."""
        if self.viewer is not None:
            from hvd_magic.widgets.closing import close_tree

            close_tree(self.viewer)
            for handle in (self.shown, self.analysis):
                handle.update({"text/html": ""}, raw=True)


def live_timeline(
    path: str | None, view: object, written: Callable[[], bool], env: Mapping[str, str]
) -> LiveTimeline | None:
    """The timeline shown while it grows, in a notebook (where the run's view is live widgets);
    ``env``: the run's."""
    if not path or type(view).__name__ != "LiveView":
        return None
    try:
        from hvd_magic.timeline import viewer  # noqa: F401 - anywidget and the bundle: the viewer can be shown
    except ImportError:  # no anywidget: the timeline is shown after the run
        return None
    from hvd_magic.timeline.analysis import fusion_threshold

    return LiveTimeline(path, written, threshold=fusion_threshold(env))
