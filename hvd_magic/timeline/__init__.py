"""Horovod Timeline: read (tolerant, columnar), analyse, export a slice.

>>> t = hvd_magic.timeline.read("horovod_timeline.json")     # doctest: +SKIP
>>> t.to_pandas()                                              # one row per event
>>> hvd_magic.timeline.analyze(t).per_activity                 # where the time went
"""

from __future__ import annotations

from typing import Any

from hvd_magic.errors import TimelineError
from hvd_magic.timeline.reader import Timeline, read

__all__ = ["Analysis", "Timeline", "TimelineError", "analyze", "export_slice", "read", "spans"]


def __getattr__(name: str) -> Any:
    # Analysis needs pandas and Arrow: load them only when asked, so read() starts fast.
    if name in ("Analysis", "analyze", "spans"):
        from hvd_magic.timeline import analysis

        return getattr(analysis, name)
    if name == "export_slice":
        from hvd_magic.timeline.export import export_slice

        return export_slice
    raise AttributeError(f"module 'hvd_magic.timeline' has no attribute {name!r}")
