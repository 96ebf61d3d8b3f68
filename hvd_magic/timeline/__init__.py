"""Horovod Timeline: read (tolerant, columnar), analyse, export a slice.

>>> t = hvd_magic.timeline.read("horovod_timeline.json")     # doctest: +SKIP
>>> t.to_pandas()                                              # one row per event
>>> hvd_magic.timeline.analyze(t).per_activity                 # where the time went
"""

from __future__ import annotations

from .analyze import Analysis, analyze, spans
from .export import export_slice
from .parse import Timeline, TimelineError, read

__all__ = ["Analysis", "Timeline", "TimelineError", "analyze", "export_slice", "read", "spans"]
