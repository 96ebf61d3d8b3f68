"""What a rank hears from the notebook while it works, on a connection of its own.

Every rank has one: a run's ranks hear a stop asked at a step boundary (``StopAsked``) and
beats; a live session's also hear their cells and interrupts. With a silence limit (live
sessions), a rank that hears no beat for that long takes the notebook for gone and leaves.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

from hvd_magic.protocol import SILENT_EXIT, Beat, Cell, Interrupt, RankStatus, StacksAsked, StopAsked
from hvd_magic.rank.hub_client import LOST_SECONDS, HubClient
from hvd_magic.rank.stacks import snapshot
from hvd_magic.rank.telemetry import ResourceSampler, gpu_probe

__all__ = ["EXIT_GRACE", "Inbox", "attach", "current"]

EXIT_GRACE = 5.0  # seconds a cell gets to stop after the notebook went silent, before exit
LOST_GRACE = 0.5  # ... after the notebook's connection closed (its process is gone)


class Inbox:
    """The rank's receiving thread: a live session's cells into ``cells`` (None: stop),
    interrupts to the running cell, a stop asked (``hvd_magic.stopping()``), every ``Beat``
    answered with a ``RankStatus``, every ``StacksAsked`` with the rank's stacks. It has a
    connection of its own (its first ``RankStatus`` introduces it), so that waiting for the
    notebook never holds up what the cell sends on the rank's main connection."""

    def __init__(self, client: HubClient, silence: float | None, session: bool = False) -> None:
        self.client, self.silence, self.session = client, silence, session
        self.stop_asked = threading.Event()
        self.stop_reason = ""  # why, when not the user's interrupt (a preemption notice)
        self.cells: queue.Queue[tuple[Cell, bytes] | None] = queue.Queue()
        self.busy = 0  # the cell running, 0 between cells
        self.finished = 0
        self.interrupting = 0  # the cell an Interrupt asked to stop
        self.gone = False  # the notebook went silent: no cell is read after that
        self.sampler = ResourceSampler(gpu_probe())
        self.client.send(self.status())
        self._thread = threading.Thread(target=self._loop, name="hvd_magic-inbox", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        heard = time.monotonic()
        while True:
            message = self.client.receive(0.5)
            now = time.monotonic()
            if self.client.lost_for() > LOST_SECONDS:
                self._notebook_gone(LOST_GRACE)
                return
            if message is None:
                if self.silence is not None and now - heard > self.silence:
                    self._notebook_gone()
                    return
                continue
            heard = now
            record = message.record
            if isinstance(record, Cell):
                self.cells.put((record, message.blob))
            elif isinstance(record, Interrupt):
                self.interrupt(record.id)
            elif isinstance(record, Beat):
                self.client.send(self.status())
            elif isinstance(record, StopAsked):
                self.stop_reason = record.reason
                self.stop_asked.set()
            elif isinstance(record, StacksAsked):
                self.client.send(snapshot(record.id, in_cell=not self.session or self.busy != 0))

    def interrupt(self, cell: int) -> None:
        if cell and cell == self.busy:
            self.interrupting = cell
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def status(self) -> RankStatus:
        figures = self.sampler.sample()
        return RankStatus(
            busy=self.busy,
            cells=self.finished,
            rss=int(figures["rss"]),
            cpu=figures["cpu"],
            gpu=figures.get("gpu", -1.0),
            gpu_memory=int(figures.get("gpu_memory", 0)),
            gpu_memory_total=int(figures.get("gpu_memory_total", 0)),
            gpu_temperature=figures.get("gpu_temperature", -1.0),
            cores=int(figures["cores"]),
            host_cpu=figures["host_cpu"],
            swapped=int(figures["swapped"]),
        )

    def _notebook_gone(self, grace: float = EXIT_GRACE) -> None:
        """The notebook (its kernel) is gone: no beat for the silence limit, or its connection
        closed. Stop the cell and leave; a cell stuck where no interrupt reaches (inside a
        collective) is not waited for."""
        self.gone = True
        self.cells.put(None)
        self.interrupt(self.busy)
        timer = threading.Timer(grace, os._exit, args=(SILENT_EXIT,))
        timer.daemon = True
        timer.start()


_current: Inbox | None = None


def attach(inbox: Inbox | None) -> None:
    global _current
    _current = inbox


def current() -> Inbox | None:
    """This rank's inbox, inside a run; None elsewhere."""
    return _current
