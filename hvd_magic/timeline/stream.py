"""Rank 0's side of the timeline: stream the file to the notebook while Horovod writes it."""

from __future__ import annotations

import os
import sys
import threading

from ..hub import HubClient
from ..protocol import FileChunk

__all__ = ["STREAM_SECONDS", "TimelineStream"]

STREAM_SECONDS = 2.0  # how often rank 0 sends what Horovod added to its timeline
_FILE_CHUNK = 4 * 1024 * 1024


class TimelineStream:
    """Rank 0 streams its Horovod Timeline to the notebook while Horovod writes it (every
    ``STREAM_SECONDS``), so that the notebook shows it growing; ``finish`` flushes Horovod's
    writer and sends the rest."""

    def __init__(self, client: HubClient, path: str) -> None:
        self.client, self.path, self.offset = client, path, 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hvd_magic-timeline", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(STREAM_SECONDS):
            self._send_new(final=False)

    def _send_new(self, final: bool) -> None:
        """Send what was added since the last call. While the run goes on, Horovod ends the
        file with a "]" after each flush and writes over it next time: send up to the last
        event's "}" only, so that the notebook's copy never holds a "]" it would not."""
        with self._lock:
            if not os.path.exists(self.path):
                return
            with open(self.path, "rb") as timeline:
                timeline.seek(self.offset)
                new = timeline.read()
            keep = len(new) if final else new.rfind(b"}") + 1
            for start in range(0, keep, _FILE_CHUNK):
                self.client.send(FileChunk("timeline"), new[start : min(keep, start + _FILE_CHUNK)])
            self.offset += keep

    def finish(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for module in ("horovod.torch", "horovod.tensorflow"):
            framework = sys.modules.get(module)
            if framework is not None:
                try:
                    framework.shutdown()  # flushes the timeline
                except Exception:  # noqa: BLE001 - a failed run may have left Horovod half-initialised
                    pass
        if not os.path.exists(self.path):
            return
        self._send_new(final=True)
        self.client.send(FileChunk("timeline", last=True))
        os.unlink(self.path)
