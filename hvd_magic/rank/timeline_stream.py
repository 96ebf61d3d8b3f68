"""Rank 0's side of the timeline: stream the file to the notebook while Horovod writes it.

Only whole events travel (``events.EventCutter``), joined by ``,\\n``; the notebook's side
(``timeline.copy.TimelineCopy``) writes the array around them. Neither Horovod's provisional
``]`` nor a half-written event can reach the notebook's copy, whatever the timing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hvd_magic.protocol import FileChunk
from hvd_magic.rank.hub_client import HubClient
from hvd_magic.rank.timeline_events import EventCutter

__all__ = [
    "STREAM_SECONDS",
    "TimelineStream",
    "initialized_horovod",
    "read_from",
    "stop_and_write_out",
]

STREAM_SECONDS = 2.0  # how often rank 0 sends what Horovod added to its timeline
_FILE_CHUNK = 4 * 1024 * 1024


CLOSE_SECONDS = 5.0  # how long rank 0 waits for Horovod's writer to write out its queue
_FRAMEWORKS = ("horovod.torch", "horovod.tensorflow")


def shutdown_horovod(path: str) -> None:
    """Have Horovod write out the timeline at ``path`` (``stop_and_write_out``), then shut down
    whichever Horovod framework the rank imported."""
    stop_and_write_out(path)
    for module in _FRAMEWORKS:
        framework = sys.modules.get(module)
        if framework is not None:
            try:
                framework.shutdown()
            except Exception:  # noqa: BLE001 - a failed run may have left Horovod half-initialised
                pass


def stop_and_write_out(path: str, timeout: float = CLOSE_SECONDS) -> bool:
    """Stop Horovod's timeline and wait (up to ``timeout``) until its writer has closed the file
    at ``path``: every queued event is then in it. ``hvd.shutdown()`` alone is not enough: it
    stops the writer at once, and what is still queued is lost (Horovod 0.28's
    ``TimelineWriter::Shutdown``), as a starved writer's last steps were under load. Whether the
    file was closed; False where Horovod is not initialised."""
    framework = initialized_horovod()
    try:
        if framework is None:
            return False
        framework.stop_timeline()  # the writer closes the file once its queue is empty
    except Exception:  # noqa: BLE001 - half-initialised, or shut down by the cell
        return False
    deadline = time.monotonic() + timeout
    while _open_here(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def initialized_horovod() -> Any:
    """The Horovod framework module this rank imported and initialised; None if there is none."""
    for name in _FRAMEWORKS:
        module = sys.modules.get(name)
        with contextlib.suppress(Exception):  # half-initialised: as good as none
            if module is not None and module.is_initialized():
                return module
    return None


def _open_here(path: str) -> bool:
    """Whether a descriptor of this process (Horovod's writer's) has ``path`` open."""
    target = os.path.realpath(path)
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:  # no /proc: nothing to wait on
        return False
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{descriptor}") == target:
                return True
    return False


def read_from(path: str, offset: int) -> bytes:
    """What the file holds past ``offset`` (empty if it does not exist yet)."""
    try:
        with open(path, "rb") as timeline:
            timeline.seek(offset)
            return timeline.read()
    except FileNotFoundError:
        return b""


class TimelineStream:
    """Rank 0 streams its Horovod Timeline to the notebook while Horovod writes it (every
    ``STREAM_SECONDS`` once ``start``-ed), so that the notebook shows it growing; ``finish``
    flushes Horovod's writer, sends the rest and says it was the last."""

    def __init__(self, client: HubClient, path: str, read: Callable[[str, int], bytes] = read_from) -> None:
        self.client, self.path, self.read = client, path, read
        self.offset = 0
        self.sent = False
        self.cutter = EventCutter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hvd_magic-timeline", daemon=True)

    def start(self) -> TimelineStream:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(STREAM_SECONDS):
            self.send_new()

    def send_new(self) -> None:
        """Send the events completed since the last call."""
        with self._lock:
            new = self.read(self.path, self.offset)
            self.offset += len(new)
            events = self.cutter.feed(new)
            batch: list[bytes] = []
            size = 0
            for event in events:
                batch.append(event)
                size += len(event) + 2
                if size >= _FILE_CHUNK:
                    self._send(batch)
                    batch, size = [], 0
            if batch:
                self._send(batch)

    def _send(self, events: list[bytes]) -> None:
        self.client.send(FileChunk("timeline"), b",\n".join(events))
        self.sent = True

    def finish(self, flush: Callable[[], None] | None = None) -> None:
        """Stop streaming, have Horovod write out its timeline (``flush``: shut Horovod down),
        send the rest and the last chunk, and delete rank 0's file."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if flush is not None:
            flush()
        else:
            shutdown_horovod(self.path)
        self.send_new()  # an event Horovod left half-written (a killed writer) stays out
        if self.sent:
            self.client.send(FileChunk("timeline", last=True))
        if os.path.exists(self.path):
            os.unlink(self.path)
