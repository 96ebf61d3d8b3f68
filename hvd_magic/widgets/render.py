"""Pure renderers from the model to HTML strings and plotly trace data (tested without a browser)."""

from __future__ import annotations

import html
import json
import math
import statistics
import time
from typing import Any

import numpy as np

from hvd_magic.widgets.state import RankProgress, RunModel, Series

__all__ = ["COMPACT_RANKS", "final_html", "grid_html", "log_html", "svg_chart", "traces"]

COMPACT_RANKS = 64
PER_RANK_TRACES_UP_TO = 16
DRAWN_POINTS = 500
STATE_COLOURS = {
    "starting": "#9e9e9e",
    "running": "#1e88e5",
    "stalled": "#fb8c00",
    "done": "#43a047",
    "failed": "#e53935",
    "ended": "#757575",  # ended with the run without saying its exit (an interrupt, a timeout)
    "skipped": "#bdbdbd",  # a live session's rank that is not part of the cell (rank=, ranks=)
}


_HEAD = "".join(
    f'<th style="text-align:left;padding:1px 8px">{h}</th>'
    for h in (
        "rank",
        "host",
        "progress",
        "",
        "step",
        "epoch",
        "steps/s",
        "ETA",
        "CPU",
        "memory",
        "GPU",
        "state",
    )
)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def _bar(progress: RankProgress) -> str:
    fraction = progress.fraction
    width = 0 if fraction is None else round(fraction * 100)
    colour = STATE_COLOURS[progress.state]
    return (
        f'<div class="hvd-bar" data-rank="{progress.rank}" data-progress="{width}" '
        f'style="background:#eee;width:160px;height:10px;border-radius:3px">'
        f'<div style="background:{colour};width:{width}%;height:100%;border-radius:3px"></div></div>'
    )


def _resources(progress: RankProgress) -> list[str]:
    """CPU %, memory (now, and the peak after the run) and GPU utilisation/memory, if any."""
    status = progress.resources
    if status is None:
        return ["", "", ""]
    live = progress.state in ("starting", "running", "stalled", "skipped")
    memory = f"{status.rss / 2**20:,.0f} MB" if live else f"peak {progress.peak_rss / 2**20:,.0f} MB"
    return [f"{status.cpu:.0f} %" if live else "", memory, status.gpu_text()]


def _row(progress: RankProgress, now: float) -> str:
    rate = progress.rate_at(now)
    step = (
        "" if progress.step is None else f"{progress.step}" + (f"/{progress.total}" if progress.total else "")
    )
    cells = [
        f"{progress.rank}",
        html.escape(progress.host),
        _bar(progress),
        f"{round((progress.fraction or 0) * 100)}%" if progress.fraction is not None else "",
        step,
        "" if progress.epoch is None else str(progress.epoch),
        "" if rate is None else f"{rate:.1f}",
        _duration(progress.eta_at(now)),
        *_resources(progress),
        _state(progress),
    ]
    return "<tr>" + "".join(f'<td style="padding:1px 8px">{c}</td>' for c in cells) + "</tr>"


def _state(progress: RankProgress) -> str:
    text = "not in this cell" if progress.state == "skipped" else progress.state
    if progress.state == "stalled" and progress.stalled_on:
        text += f": never {progress.stalled_action} " + ", ".join(progress.stalled_on[:3])
        text += f" (+{len(progress.stalled_on) - 3})" if len(progress.stalled_on) > 3 else ""
    if progress.straggling is not None:
        text += f" · straggler: {progress.straggling.reason.partition(':')[0]}"
    return f'<span class="hvd-state" style="color:{STATE_COLOURS[progress.state]}">{html.escape(text)}</span>'


def grid_html(model: RunModel, every_rank: bool = False) -> str:
    """A row per rank; from ``COMPACT_RANKS`` ranks on, a strip plus the slowest and failed ranks,
    or with ``every_rank`` (the panel's tab, on demand) every rank's row in a box that scrolls."""
    if model.ranks >= COMPACT_RANKS and not every_rank:
        return _compact_html(model)
    now = time.monotonic()
    rows = "".join(_row(p, now) for p in model.progress)
    style = "font-size:12px;border-collapse:collapse"
    table = f'<table class="hvd-grid" style="{style}"><tr>{_HEAD}</tr>{rows}</table>'
    if model.ranks < COMPACT_RANKS:
        return table
    return f'<div class="hvd-grid-scroll" style="max-height:360px;overflow:auto">{table}</div>'


def _compact_html(model: RunModel) -> str:
    fractions = [p.fraction or 0.0 for p in model.progress]
    cells = "".join(
        f'<span title="rank {p.rank}: {p.state} {round((p.fraction or 0) * 100)}%" '
        f'style="display:inline-block;width:8px;height:12px;margin:0 1px;'
        f'background:{STATE_COLOURS[p.state]};opacity:{0.3 + 0.7 * (p.fraction or 0):.2f}"></span>'
        for p in model.progress
    )
    counts = ", ".join(f"{n} {state}" for state, n in model.counts().items() if n)
    ranked = (p for p in model.progress if p.state not in ("failed", "skipped"))
    slowest = sorted(ranked, key=lambda p: p.fraction or 0)[:5]
    failed = [p for p in model.progress if p.state == "failed"]
    failed += [p for p in model.progress if p.straggling is not None and p not in slowest + failed]
    now = time.monotonic()
    rows = "".join(_row(p, now) for p in failed + slowest)
    return (
        f'<div class="hvd-compact" style="font-size:12px">{model.ranks} ranks: {counts}; progress min '
        f"{min(fractions):.0%}, median {statistics.median(fractions):.0%}, max {max(fractions):.0%}</div>"
        f'<div style="line-height:14px">{cells}</div>'
        f'<div style="font-size:12px;margin-top:4px">failed and slowest ranks:</div>'
        f'<table class="hvd-grid" style="font-size:12px"><tr>{_HEAD}</tr>{rows}</table>'
    )


def log_html(text: str) -> str:
    return (
        '<pre class="hvd-log" style="max-height:300px;overflow:auto;font-size:12px;margin:0">'
        f"{html.escape(text)}</pre>"
    )


def plotted(model: RunModel, every_rank: bool) -> dict[str, list[dict[str, Any]]]:
    """Each metric's plotly traces as the live view under the cell draws them (``traces``), in
    plain lists (JSON, a value that is not finite as null: a gap, as plotly draws NaN): every
    rank's line (``every_rank``), else the band of the ranks around their mean."""
    ranks = model.ranks if every_rank else 0
    drawn = {metric: traces(model, metric, max_ranks=ranks) for metric in model.series}
    return {
        metric: [{key: _listed(value) for key, value in trace.items()} for trace in lines]
        for metric, lines in drawn.items()
    }


def _listed(value: Any) -> Any:
    if not isinstance(value, np.ndarray):
        return value
    if value.dtype.kind != "f" or np.isfinite(value).all():
        return value.tolist()
    return [v if math.isfinite(v) else None for v in value.tolist()]


def _thin(steps: list[float], values: list[float], max_points: int) -> tuple[np.ndarray, np.ndarray]:
    stride = max(1, -(-len(steps) // max_points))
    x, y = np.asarray(steps[::stride]), np.asarray(values[::stride])
    if stride > 1 and steps and x[-1] != steps[-1]:  # always show the newest point
        x, y = np.append(x, steps[-1]), np.append(y, values[-1])
    return x, y


def traces(
    model: RunModel, metric: str, max_ranks: int = PER_RANK_TRACES_UP_TO, max_points: int = DRAWN_POINTS
) -> list[dict[str, Any]]:
    """Plotly scatter traces: a line per rank (thin) and the mean (thick).

    With more than ``max_ranks`` ranks, the per-rank lines become a min-max band around the
    mean; every line is thinned to ``max_points`` for drawing (numpy arrays: plotly validates
    them without walking each element).
    """
    by_rank = model.series.get(metric, {})
    mean = model.mean_series(metric)
    data: list[dict[str, Any]] = []
    if len(by_rank) <= max_ranks:
        for rank, series in sorted(by_rank.items()):
            x, y = _thin(series.steps, series.values, max_points)
            data.append(
                {
                    "mode": "lines",
                    "name": f"rank {rank}",
                    "x": x,
                    "y": y,
                    "line": {"width": 1},
                    "opacity": 0.6,
                }
            )
    elif mean.steps:
        low, high = model.band_series(metric)
        for name, band in (("min", low), ("max", high)):
            x, y = _thin(band.steps, band.values, max_points)
            fill = {"fill": "tonexty"} if name == "max" else {}
            data.append({"mode": "lines", "name": f"{name} of {len(by_rank)} ranks", "x": x, "y": y,
                         "line": {"width": 0}, **fill})  # fmt: skip
    if mean.steps:
        x, y = _thin(mean.steps, mean.values, max_points)
        data.append({"mode": "lines", "name": "mean", "x": x, "y": y, "line": {"width": 3, "color": "#000"}})
    return data


def svg_chart(series: dict[str, Series], width: int = 480, height: int = 160) -> str:
    """A small static line chart (for the saved notebook and its HTML export). A value that is
    not finite (a loss gone to nan or inf) breaks its line there and is left out of the scale."""
    points = [
        (x, y) for s in series.values() for x, y in zip(s.steps, s.values, strict=True) if math.isfinite(y)
    ]
    if not points:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = (width - 50) / ((x1 - x0) or 1)
    sy = (height - 20) / ((y1 - y0) or 1)
    lines = []
    for name, s in series.items():
        style = (
            'stroke="#000" stroke-width="2"'
            if name == "mean"
            else 'stroke="#1e88e5" stroke-width="1" opacity="0.5"'
        )
        for run in _finite_runs(s):
            path = " ".join(f"{45 + (x - x0) * sx:.1f},{height - 10 - (y - y0) * sy:.1f}" for x, y in run)
            lines.append(
                f'<polyline fill="none" {style} points="{path}"><title>{html.escape(name)}</title></polyline>'
            )
    labels = [(0, 12, y1), (0, height - 10, y0), (45, height, x0), (width - 40, height, x1)]
    axes = "".join(f'<text x="{x}" y="{y}" font-size="10">{v:.4g}</text>' for x, y, v in labels)
    svg = f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    return f"{svg}{axes}{''.join(lines)}</svg>"


def _finite_runs(series: Series) -> list[list[tuple[float, float]]]:
    """``series``' points in runs between the values that are not finite."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(series.steps, series.values, strict=True):
        if math.isfinite(y):
            runs[-1].append((x, y))
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def final_html(model: RunModel, every_rank: bool = False, curves: bool = True) -> str:
    """The run's record, kept in the notebook: summary, grid, curves (with their data), logs.
    ``every_rank``: a large run's grid with every rank's row (``grid_html``); ``curves=False``:
    a place for the curves instead (the panel's tab draws them with plotly: ``plotted``)."""
    parts = [
        f'<div class="hvd-summary" style="font-weight:bold">hvd_magic: {html.escape(model.summary())}</div>'
    ]
    parts.append(grid_html(model, every_rank))
    data = {}
    for metric in model.series if curves else ():
        chart = {f"rank {r}": s for r, s in sorted(model.series[metric].items())}
        chart["mean"] = model.mean_series(metric)
        parts.append(f"<div><b>{html.escape(metric)}</b><br>{svg_chart(chart)}</div>")
        data[metric] = {
            name: {"step": s.steps, "value": _listed(np.asarray(s.values, dtype=float))}
            for name, s in chart.items()
        }
    if data:
        payload = json.dumps(data).replace("</", "<\\/")  # raw text inside <script>: only "</" matters
        parts.append(f'<script type="application/json" class="hvd-metrics">{payload}</script>')
    if not curves:
        parts.append('<div class="hvd-curves-here"></div>')
    logs = "".join(
        f"<details><summary>rank {rank} log</summary>{log_html(log.text())}</details>"
        for rank, log in enumerate(model.logs)
        if log.text()
    )
    parts.append(logs)
    return f'<div class="hvd-final">{"".join(parts)}</div>'
