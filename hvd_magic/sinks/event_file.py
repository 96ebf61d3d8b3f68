"""A TensorBoard event file, written with TensorBoard's own pieces: its protos (``Event``,
``Summary``) and its record framing (``RecordWriter``: length, masked CRC32C, data, CRC).

Why not a whole writer: TensorBoard's ``DirectoryOutput`` (behind ``tensorboard.summary.Writer``)
opens its file through ``tf.io.gfile``, which imports TensorFlow whenever it is installed (4 s
and its memory in the notebook, measured here, for a run that trains in other processes);
``torch.utils.tensorboard`` imports torch and TensorFlow, tensorboardX torch. And ``Writer``
stores each scalar as a tensor proto, three times the work of a ``simple_value`` (the classic
scalar, which TensorBoard's scalars dashboard reads the same), on the notebook thread that
also feeds the live view.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

__all__ = ["EventFile"]

_numbers = itertools.count()  # two files opened in the same second get different names


class EventFile:
    """One event file in ``folder``, named as TensorFlow names them
    (``events.out.tfevents.TIME.HOST.PID.N``) so that TensorBoard finds it."""

    def __init__(self, folder: str) -> None:
        stamp, host = f"{int(time.time()):010d}", socket.gethostname()
        self.path = os.path.join(folder, f"events.out.tfevents.{stamp}.{host}.{os.getpid()}.{next(_numbers)}")
        self._records = RecordWriter(open(self.path, "wb"))  # noqa: SIM115 - closed by close()
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def scalar(self, tag: str, value: float, step: int, wall_time: float, description: str = "") -> None:
        """One point of the series ``tag``; ``description`` is kept from its first point."""
        summary = summary_pb2.Summary()
        entry = summary.value.add(tag=tag, simple_value=value)
        if description:
            entry.metadata.summary_description = description
        self._write(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def _write(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()
