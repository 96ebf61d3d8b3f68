"""TensorBoard event files of a run (``logdir=``), written on the notebook's side from the
ranks' reports: each metric per rank as ``name/rank_N`` and the mean across ranks as ``name``;
and each rank's resources as it samples them (``resources/NAME/rank_N``: CPU %, memory MB, and
its GPU's utilisation, memory and temperature where it has one), their step being the seconds
since the run began (they are sampled in time, about once a second, not per training step);
and ``stragglers/rank_N``, 1 when the straggler watch names rank N and 0 once it caught up, at
the seconds since the run began.

Written with TensorBoard's own protos and record framing (``event_file``), without importing
TensorFlow or torch into the notebook: tensorboard is the one package needed, the one that
also opens the files (``tensorboard --logdir``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from hvd_magic.protocol import Message, RankStatus, Straggler
from hvd_magic.sinks.scalars import Point, Scalars

__all__ = ["FLUSH_SECONDS", "TensorBoardSink", "resource_points"]

FLUSH_SECONDS = 5.0  # how stale the files may be for a TensorBoard watching them during the run


class TensorBoardSink:
    """Writes the run's scalars into ``folder`` (one run's folder: TensorBoard shows it as a run)."""

    def __init__(self, folder: str, ranks: int, clock: Callable[[], float] = time.monotonic) -> None:
        os.makedirs(folder, exist_ok=True)
        self.folder, self.clock = folder, clock
        from hvd_magic.sinks.event_file import EventFile

        self.writer = EventFile(folder)
        self.scalars = Scalars(ranks)
        self.ranks = ranks
        self._described: set[str] = set()
        self._began = clock()
        self._flushed = clock()
        self._unflushed = False

    def message(self, message: Message) -> None:
        now = self.clock()
        record = message.record
        if isinstance(record, RankStatus):
            points = resource_points(message.rank, record, int(now - self._began), time.time())
        elif isinstance(record, Straggler):  # 1 from when it is named, 0 once it caught up
            value = 0.0 if record.recovered else 1.0
            points = [Point("stragglers", int(now - self._began), value, time.time(), record.slow_rank)]
        else:
            points = self.scalars.take(message, now)
        for point in points:
            self._write(point)
        if self._unflushed and now - self._flushed >= FLUSH_SECONDS:  # any message: ranks beat each second
            self._flushed, self._unflushed = now, False
            self.writer.flush()

    def close(self, outcome: BaseException | None) -> None:
        for point in self.scalars.rest():
            self._write(point)
        self.writer.close()

    def _write(self, point: Point) -> None:
        self._unflushed = True
        tag = point.name if point.rank is None else f"{point.name}/rank_{point.rank}"
        description = ""
        if tag not in self._described:  # TensorBoard keeps the first; no need to repeat it
            self._described.add(tag)
            description = (
                f"mean across the {self.ranks} ranks at each step"
                if point.rank is None
                else f"as rank {point.rank} reported it"
            )
        self.writer.scalar(tag, point.value, point.step, point.wall_time, description)


def resource_points(rank: int, status: RankStatus, step: int, wall_time: float) -> list[Point]:
    """What a rank's ``RankStatus`` says of its resources, as points of that rank at ``step``."""
    values = {"cpu_percent": status.cpu, "memory_mb": status.rss / 2**20}
    if status.gpu >= 0:  # -1: no GPU
        values |= {"gpu_percent": status.gpu, "gpu_memory_mb": status.gpu_memory / 2**20}
        if status.gpu_temperature >= 0:
            values["gpu_temperature_c"] = status.gpu_temperature
    return [Point(f"resources/{name}", step, float(value), wall_time, rank) for name, value in values.items()]
