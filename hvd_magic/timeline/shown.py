"""A finished timeline under a cell: its event count, the interactive viewer, the analysis.

Each display carries a text form besides its HTML (or widget): what a terminal, a headless run
(``scripts/run_notebook.py``) or an export that lacks the widget shows in its place.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from hvd_magic.errors import HorovodMagicError
from hvd_magic.timeline.analysis import analyze, fusion_threshold
from hvd_magic.timeline.hints import summary
from hvd_magic.timeline.reader import read

__all__ = ["show_run_timeline", "show_timeline"]


def show_timeline(path: str, threshold: int | None = None, hosts: Mapping[int, str] | None = None) -> None:
    """Display the timeline at ``path``; ``threshold``: the run's fusion buffer (bytes), which
    the analysis measures the collectives against; ``hosts``: each rank's host. Raises
    ``TimelineError`` for a file that is not a Horovod Timeline.

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
        from hvd_magic.timeline.viewer import TimelineViewer
    except ImportError:  # anywidget not installed: the analysis still works
        pass
    else:
        display(TimelineViewer.from_timeline(timeline))
    analysis = analyze(timeline, threshold, hosts)
    html = f"<div class='hvd-timeline'>{analysis.to_html()}</div>"
    display({"text/html": html, "text/plain": summary(analysis)}, raw=True)


def show_run_timeline(path: str, env: Mapping[str, str], hosts: Mapping[int, str] | None = None) -> None:
    """A run's (or a live session's cell's) own timeline, after it, whatever its outcome: a
    timeline that cannot be read is reported on stderr, never in place of the run's own error.
    ``env``: the run's (its fusion threshold is what the analysis measures the collectives against);
    ``hosts``: where its ranks ran."""
    try:
        show_timeline(path, fusion_threshold(env), hosts)
    except HorovodMagicError as err:  # TimelineError among them
        print(f"hvd_magic: the run's timeline could not be shown: {err}", file=sys.stderr)
