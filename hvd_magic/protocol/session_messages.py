"""The records of a live session (``%horovod start``): cells sent to ranks that stay up, and
the heartbeat that lets them notice a notebook that went away. Kinds are in ``messages``."""

from __future__ import annotations

from dataclasses import dataclass

from hvd_magic.protocol.messages import Kind, Record, _kind

__all__ = ["Beat", "Cell", "CellDone", "Interrupt", "RankStatus"]


@_kind(Kind.CELL)
@dataclass(frozen=True)
class Cell(Record):
    """Run the pickled payload (the blob) in the rank's kept namespace. ``reply`` is the rank
    that sends the value back (the lowest of the ranks the cell runs on). ``timeline``: rank 0
    records a Horovod Timeline of the cell and streams it back (``mark_cycles``: with Horovod's
    cycle marks)."""

    id: int
    reply: int = 0
    timeline: bool = False
    mark_cycles: bool = False


@_kind(Kind.CELL_DONE)
@dataclass(frozen=True)
class CellDone(Record):
    """The rank finished cell ``id`` (its output sent before this); ``ok`` is False when the
    cell raised (the error was sent as a ``RankError``)."""

    id: int
    ok: bool = True


@_kind(Kind.INTERRUPT)
@dataclass(frozen=True)
class Interrupt(Record):
    """Raise KeyboardInterrupt in the rank's running cell ``id`` (none if it has finished)."""

    id: int


@_kind(Kind.BEAT)
@dataclass(frozen=True)
class Beat(Record):
    """The notebook is alive. A rank that hears none for its silence limit exits."""


@_kind(Kind.RANK_STATUS)
@dataclass(frozen=True)
class RankStatus(Record):
    """A rank's answer to a ``Beat`` (``telemetry``): what the grid and ``%horovod status``
    show. GPU figures are -1 / 0 where the rank has no GPU."""

    busy: int = 0  # a live session's cell it runs, 0 when idle
    cells: int = 0  # a live session's cells it finished
    rss: int = 0  # bytes, its process tree
    cpu: float = 0.0  # percent of one core since the last beat, its process tree
    gpu: float = -1.0  # its GPU's utilisation, percent
    gpu_memory: int = 0  # bytes used on its GPU
    gpu_memory_total: int = 0
    gpu_temperature: float = -1.0  # degrees Celsius
    cores: int = 0  # CPU cores the rank may run on (its affinity)
    host_cpu: float = -1.0  # percent of its host's CPUs busy since the last beat, all processes
    swapped: int = 0  # bytes its host swapped in and out since it booted

    def gpu_text(self) -> str:
        """ "37 %, 1.2/141 GB, 45 °C" (what the grid and ``%horovod status`` show), "" without a GPU."""
        if self.gpu < 0:
            return ""
        text = f"{self.gpu:.0f} %, {self.gpu_memory / 2**30:.1f}/{self.gpu_memory_total / 2**30:.0f} GB"
        return text + (f", {self.gpu_temperature:.0f} °C" if self.gpu_temperature >= 0 else "")
