"""A finished timeline under a cell: its event count, the interactive viewer, the analysis.

Each display carries a text form besides its HTML (or widget): what a terminal, a headless run
(``scripts/run_notebook.py``) or an export that lacks the widget shows in its place.
"""

from __future__ import annotations

from .analysis import analyze
from .hints import summary
from .reader import read

__all__ = ["show_timeline"]


def show_timeline(path: str, threshold: int | None = None) -> None:
    """Display the timeline at ``path``; ``threshold``: the run's fusion buffer (bytes), which
    the analysis measures the collectives against. Raises ``TimelineError`` for a file that is
    not a Horovod Timeline.

    >>> show_timeline("horovod_timeline.json")   # doctest: +SKIP
    """
    from IPython.display import display

    timeline = read(path)
    note = ""
    if timeline.truncated:
        note = " (cut off mid-event: the run was stopped while writing; the partial event was dropped)"
    elif not timeline.closed:
        note = " (no closing ']': the run was stopped, or Horovod < 0.20 wrote it)"
    events = f"{path}: {len(timeline):,} events{note}"
    display({"text/html": f"<small>{events}</small>", "text/plain": events}, raw=True)
    try:
        from .viewer import TimelineViewer
    except ImportError:  # anywidget not installed: the analysis still works
        pass
    else:
        display(TimelineViewer.from_timeline(timeline))
    analysis = analyze(timeline, threshold)
    html = f"<div class='hvd-timeline'>{analysis.to_html()}</div>"
    display({"text/html": html, "text/plain": summary(analysis)}, raw=True)
