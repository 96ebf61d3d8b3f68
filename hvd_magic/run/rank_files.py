"""The notebook's side of the files rank 0 streams back during a run.

- its Horovod Timeline (``FileChunk("timeline")``: whole events, see ``rank.timeline_stream``) goes
  to the path the user asked for, as a JSON array that is always whole but for its closing
  ``]``, which ``close`` writes when the run ends, whether or not rank 0 lived to say so;
- ``hvd_magic.checkpoint``'s go to the run's ``CheckpointStore``, which keeps the last;
- a ``KeptRequest`` after a checkpoint (``checkpoint(..., wait=True)``) is answered once the
  chunks before it on rank 0's connection are taken, so "kept" means whole in the store;
- other files (``reporting.send_file``: the files an estimator's Keras callbacks wrote) go into
  the run's ``files_dir``.
Both under a temporary name until their last chunk arrived: a torn file never has its name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import BinaryIO

from hvd_magic.protocol import FileChunk, KeptAnswer, KeptRequest, Message, Record
from hvd_magic.protocol.files import CHECKPOINT_PREFIX
from hvd_magic.run.checkpoint_store import CheckpointStore

__all__ = ["RankFiles", "TimelineCopy"]


class TimelineCopy:
    """Writes whole events as they arrive: ``[``, the events joined by ``,``, and ``]`` on
    ``close``. Between calls the file parses once closed; after ``close`` it parses as it is."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self.closed = False

    @property
    def started(self) -> bool:
        return self._file is not None or self.closed

    def append(self, events: bytes) -> None:
        if self.closed or not events:
            return
        if self._file is None:
            self._file = open(self.path, "wb")  # noqa: SIM115 - kept open for the run's appends
            self._file.write(b"[\n")
        else:
            self._file.write(b",\n")
        self._file.write(events)
        self._file.flush()  # the live view reads the file between messages

    def close(self) -> None:
        if self._file is None or self.closed:
            return
        self._file.write(b"\n]\n")
        self._file.close()
        self.closed = True


class RankFiles:
    """Routes rank 0's ``FileChunk`` messages to the timeline copy or to ``files_dir``."""

    def __init__(
        self,
        timeline: str | None,
        files_dir: str | None,
        checkpoints: CheckpointStore | None = None,
        reply: Callable[[bytes, Record], None] | None = None,
    ) -> None:
        self.timeline = TimelineCopy(timeline) if timeline else None
        self.files_dir, self.checkpoints, self.reply = files_dir, checkpoints, reply
        self.started: set[str] = set()

    def take(self, message: Message) -> None:
        record = message.record
        if isinstance(record, KeptRequest) and self.reply is not None:
            try:
                kept = self.checkpoints is not None and record.step in self.checkpoints.steps()
            except OSError:  # the store cannot say: not known to be kept
                kept = False
            self.reply(message.identity, KeptAnswer(record.id, kept=kept))
            return
        if message.rank != 0 or not isinstance(record, FileChunk):
            return
        if record.name == "timeline":
            if self.timeline is not None:
                self.timeline.append(message.blob)
                if record.last:
                    self.timeline.close()
            return
        path = self._path(record.name)
        if path is None:
            return
        partial = f"{path}.partial"
        with open(partial, "ab" if record.name in self.started else "wb") as out:
            out.write(message.blob)
        self.started.add(record.name)
        if record.last:
            os.replace(partial, path)
            self.started.discard(record.name)
            if self.checkpoints is not None and record.name.startswith(CHECKPOINT_PREFIX):
                self._publish(path)

    def _publish(self, path: str) -> None:
        """A checkpoint landed: kept by the store. Where the store cannot take it (an object
        store's error), the run goes on and says so: the checkpoint before stays the latest."""
        assert self.checkpoints is not None
        try:
            self.checkpoints.landed(path)
        except OSError as err:
            print(
                f"hvd_magic: checkpoint {os.path.basename(path)} could not be kept in "
                f"{self.checkpoints.target}: {type(err).__name__}: {err}",
                file=sys.stderr,
            )

    def writing_timeline(self) -> bool:
        """Whether this run's timeline has begun arriving (until then the path may hold an
        earlier run's)."""
        return self.timeline is not None and self.timeline.started

    def close(self) -> None:
        """The run is over: a timeline whose last chunk never came (rank 0 died) is closed."""
        if self.timeline is not None:
            self.timeline.close()

    def _path(self, name: str) -> str | None:
        folder = self.files_dir
        if name.startswith(CHECKPOINT_PREFIX):
            folder = self.checkpoints.folder if self.checkpoints is not None else None
        if folder is None or os.path.basename(name) != name or name.startswith("."):
            return None  # nobody asked for files, or a name that would leave the folder
        return os.path.join(folder, name)
