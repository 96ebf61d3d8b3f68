"""A live session's cell timeline, on rank 0 (Horovod's coordinator, which alone writes one).

The session's ranks were started with ``HOROVOD_TIMELINE=DYNAMIC`` (``%horovod start
timeline=yes``): Horovod then writes nothing until ``hvd.start_timeline(file)``. A cell with
``timeline=`` has it started before the cell's code and stopped after it (``stop_timeline``;
its writer then writes out what is queued and closes the file, which rank 0 waits for), and
streamed to the notebook as a run's is (``rank.timeline_stream.TimelineStream``), so the file holds
that cell's collectives only. It must not import IPython.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

from hvd_magic.rank.hub_client import HubClient
from hvd_magic.rank.timeline_stream import TimelineStream, initialized_horovod, stop_and_write_out

__all__ = ["CellTimeline", "horovod_framework"]


def horovod_framework() -> Any:
    """The initialised Horovod framework module of this rank (the session's set-up cell
    imported one and called ``hvd.init()``)."""
    framework = initialized_horovod()
    if framework is not None:
        return framework
    raise RuntimeError(
        "timeline=: Horovod is not initialised on rank 0, so it cannot record this cell's timeline "
        "(did a cell call hvd.shutdown()? %horovod stop, then %horovod start ... timeline=yes)"
    )


class CellTimeline:
    """Records the timeline of one cell on rank 0 and streams it to the notebook: made before
    the cell, ``finish``-ed after it (whatever its outcome)."""

    def __init__(self, client: HubClient, mark_cycles: bool) -> None:
        self.framework = horovod_framework()
        self.path = os.path.join(tempfile.gettempdir(), f"hvd_magic-timeline-{uuid.uuid4().hex}.json")
        self.framework.start_timeline(self.path, mark_cycles=mark_cycles)
        self.stream = TimelineStream(client, self.path).start()

    def finish(self) -> None:
        """Stop recording (the file is then whole), send the rest, delete rank 0's file."""
        self.stream.finish(flush=self._stop)

    def _stop(self) -> None:
        stop_and_write_out(self.path)  # nothing to wait for if the cell shut Horovod down
