"""The live view under a ``%%horovod`` cell: progress grid, metric curves, per-rank logs.

Messages are folded into the model as they arrive; the widgets are redrawn at most
``MAX_UPDATES_PER_SECOND`` times a second, in one batch, whatever the message rate. When the run
ends, the live widget is replaced in place by a static record of the final state (summary, grid,
curves with their data, logs), so the saved notebook and its HTML export show it without
widget state (plotly's streamed updates are not in its saved widget state), and the live widgets
are closed: they leave the kernel and the notebook's saved widget state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
from IPython.display import display

from hvd_magic.protocol import Message
from hvd_magic.widgets.closing import close_tree
from hvd_magic.widgets.render import final_html, grid_html, log_html, traces
from hvd_magic.widgets.state import RunModel

__all__ = ["LiveView"]

MAX_UPDATES_PER_SECOND = 10
CURVE_UPDATES_PER_SECOND = 2  # plotly re-validates every array it is given: redraw curves less
TABS_UP_TO = 16  # more ranks: one log pane with a rank selector


class RunRecord:
    """What stays in the notebook after the run: rich HTML, and a text form for terminals."""

    def __init__(self, model: RunModel) -> None:
        self.html = final_html(model)
        tail = model.all_log.lines[-20:]
        self.text = "\n".join([f"hvd_magic: {model.summary()}", *tail])

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


class LiveView:
    """A ``RunView`` drawing into ipywidgets; ``updates`` counts redraws (for benchmarks)."""

    def __init__(self, ranks: int, show: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.model = RunModel(ranks)
        self.updates = 0
        self._drawn_version = -1
        self._curves_version = -1  # curves redraw less often: they may lag the rest
        self._last_draw = -1.0
        self._last_curves = -1.0
        self.grid = widgets.HTML()
        self.metric = widgets.Dropdown(options=[], description="metric", layout={"width": "260px"})
        self.metric.observe(lambda _: self._draw_curves(), names="value")
        self.figure = go.FigureWidget(
            layout={"height": 280, "margin": {"l": 40, "r": 10, "t": 10, "b": 30}, "xaxis_title": "step"}
        )
        names = ["all"] + [str(rank) for rank in range(ranks)]
        self.log_panes = [widgets.HTML() for _ in names] if ranks <= TABS_UP_TO else [widgets.HTML()]
        if ranks <= TABS_UP_TO:
            self.logs: widgets.Widget = widgets.Tab(children=self.log_panes, titles=names)
            self._log_choice: widgets.Dropdown | None = None
        else:
            self._log_choice = widgets.Dropdown(options=names, description="log of")
            self._log_choice.observe(lambda _: self._draw_logs(), names="value")
            self.logs = widgets.VBox([self._log_choice, self.log_panes[0]])
        self.summary = widgets.HTML()
        self.box = widgets.VBox([self.grid, self.metric, self.figure, self.logs, self.summary])
        self._handle = display(self.box, display_id=True) if show else None

    def notice(self, text: str) -> None:
        self.model.notices.append(text)
        self.model.version += 1

    def message(self, message: Message) -> None:
        self.model.apply(message)

    def tick(self) -> None:
        now = self.clock()
        if now - self._last_draw < 1 / MAX_UPDATES_PER_SECOND:
            return
        if self.model.version != self._drawn_version:
            self.draw()
        elif now - self._last_draw >= 1.0 and self.model.counts().get("running"):
            self._last_draw = now  # quiet ranks: their steps/s and ETA decay, redrawn each second
            self.grid.value = grid_html(self.model)
        elif (
            self._curves_version != self.model.version
            and now - self._last_curves >= 1 / CURVE_UPDATES_PER_SECOND
        ):
            self._last_curves = now  # the run went quiet before the curves caught up
            with self.figure.batch_update():
                self._draw_curves()

    def draw(self, final: bool = False) -> None:
        self._last_draw = self.clock()
        self._drawn_version = self.model.version
        self.updates += 1
        with self.box.hold_sync():
            self.grid.value = grid_html(self.model)
            metrics = sorted(self.model.series)
            if list(self.metric.options) != metrics:
                current = self.metric.value
                self.metric.options = metrics
                self.metric.value = current if current in metrics else (metrics[0] if metrics else None)
            if self._last_draw - self._last_curves >= 1 / CURVE_UPDATES_PER_SECOND or final:
                self._last_curves = self._last_draw
                self._draw_curves()
            self._draw_logs()
            self.summary.value = f"<small>{self.model.summary()}</small>"

    def _draw_curves(self) -> None:
        self._curves_version = self.model.version
        data: list[dict[str, Any]] = traces(self.model, self.metric.value) if self.metric.value else []
        with self.figure.batch_update():
            if len(self.figure.data) != len(data):
                self.figure.data = ()
                for trace in data:
                    self.figure.add_scatter(**trace)
            else:
                for shown, trace in zip(self.figure.data, data, strict=True):
                    shown.x, shown.y, shown.name = trace["x"], trace["y"], trace["name"]

    def _draw_logs(self) -> None:
        if self._log_choice is None:
            self.log_panes[0].value = log_html(self.model.all_log.text())
            for rank, pane in enumerate(self.log_panes[1:]):
                pane.value = log_html(self.model.logs[rank].text())
            return
        choice = self._log_choice.value
        log = self.model.all_log if choice == "all" else self.model.logs[int(choice)]
        self.log_panes[0].value = log_html(log.text())

    def close(self) -> None:
        """The final state, drawn once more, then kept as a static record in the live view's
        place; every live widget is closed, so that it leaves the kernel and the saved notebook
        (each plotly figure carries plotly's 5 MB script in its state)."""
        self.model.end()
        self.draw(final=True)
        if self._handle is not None:
            self._handle.update(RunRecord(self.model))
        close_tree(self.box)
