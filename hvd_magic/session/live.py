"""A live session on the notebook's side: ranks started once (locally or as one long barrier
stage on Spark) that run cell after cell in kept namespaces.

``LiveSession.start`` launches them with a ``SessionPayload``, whose set-up cell initialises
Horovod (or torch.distributed) once; ``run`` sends a packed cell or function to some or all
ranks and runs it as a ``CellRun`` (a run's supervision and view, see ``cell``); a thread
sends each rank a ``Beat`` every second, which the ranks answer with their figures
(``status``) and without which they exit (a kernel that died leaves nothing behind); ``end``
stops every process and frees the Spark slots.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import cloudpickle

from hvd_magic import launch
from hvd_magic.errors import SessionEnded
from hvd_magic.hub import Hub
from hvd_magic.options import RunOptions
from hvd_magic.protocol import (
    SILENT_EXIT,
    Beat,
    Cell,
    CellDone,
    CellPayload,
    Exit,
    Interrupt,
    Message,
    RankStatus,
    SessionPayload,
    Started,
)
from hvd_magic.protocol.env import TIMELINE_DYNAMIC
from hvd_magic.run.endpoint import serve_in_kernel
from hvd_magic.run.graceful import interrupts_deferred
from hvd_magic.run.history import HISTORY
from hvd_magic.run.packing import Packed
from hvd_magic.run.recording import recorded_sinks
from hvd_magic.run.views import RunView, make_view
from hvd_magic.session import ranks
from hvd_magic.session.cell import CellLauncher, CellRun
from hvd_magic.session.ranks import RankInfo

__all__ = ["LiveSession"]


class LiveSession:
    """Ranks that stay up across cells. One per kernel (the magic keeps it). ``timeline``: the
    ranks start with Horovod's dynamic timeline, so that a cell may record its own."""

    def __init__(
        self,
        options: RunOptions,
        idle: float | None = None,
        timeline: bool = False,
        *,
        launcher: launch.Launcher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``launcher`` (made from ``options`` when not given) and ``clock`` (what ``idle=``
        and the summary count with) can be stand-ins: the claim and idle rule alone."""
        self.options, self.idle, self.timeline, self.clock = options, idle, timeline, clock
        self.size = options.ranks
        self.launcher = launcher or launch.create(options, imports=ranks.setup_imports(options))
        self.hub: Hub | None = None
        self.ranks: dict[int, RankInfo] = {}
        self.done: dict[int, set[int]] = {}  # cell -> ranks that finished it
        self.cells = itertools.count(1)
        self.lost: str | None = None  # why the session is over, once it is
        self.began = clock()
        self.last_cell = self.began
        self.running = 0  # cells in flight (Session.run may be called from several threads)
        self._ended = threading.Event()
        self._lock = threading.RLock()  # end() from within end() (a stop that ends the session) returns
        self._answered = threading.Condition()

    # --- the lifetime -------------------------------------------------------------------

    def start(self, view: RunView | None = None) -> str:
        """Start the ranks and run the set-up cell on each; a one-line summary."""
        first = CellPayload(ranks.setup_source(self.options), {})
        blob = cloudpickle.dumps(SessionPayload(first, silence=ranks.SILENCE_SECONDS))
        self.hub = Hub(self.launcher.bind_host, blob)
        self.hub.taps[Started] = self._started
        self.hub.taps[CellDone] = self._cell_done
        self.hub.taps[RankStatus] = self._status
        cell = CellLauncher(self, Cell(0), list(range(self.size)), b"")
        view = view or make_view(self.size)
        for text in self.launcher.notices:
            view.notice(text)
        options = self.options
        if self.timeline:  # HOROVOD_TIMELINE is read once, by hvd.init()
            options = dataclasses.replace(options, env={**options.env, "HOROVOD_TIMELINE": TIMELINE_DYNAMIC})
        # Beats from the start: a rank counts its silence from its first moment, and the set-up
        # cell (imports, hvd.init) may take longer than the limit on a busy machine.
        with self.claim():  # the set-up cell is a cell: idle= counts from its end, not the start's
            threading.Thread(target=self.beat, name="hvd_magic-beat", daemon=True).start()
            try:
                CellRun(self.hub, cell, view, options).supervise()
            except BaseException:
                self.end()
                raise
        HISTORY.sessions[id(self)] = functools.partial(ranks.panel_row, self)  # the Horovod panel's
        serve_in_kernel(HISTORY)
        hosts = sorted({info.started.host for info in self.ranks.values() if info.started})
        where = "this machine" if self.options.np < 0 else f"{len(hosts)} host{'s' if len(hosts) > 1 else ''}"
        return (
            f"live session: {self.size} ranks on {where} ({', '.join(hosts)}), "
            f"{'torch.distributed' if self.options.launcher == 'torch' else 'Horovod'} initialised, "
            f"in {self.clock() - self.began:.1f} s. %%horovod cells run on it; %horovod stop ends it."
        )

    @property
    def live(self) -> bool:
        """Asked before each cell: its processes are polled now, not only by the beat (a kernel
        resumed after its ranks left would otherwise send its next cell to ranks long gone)."""
        if not self._over and (code := ranks.ended(self.launcher)) is not None:
            self.lost = self.why_ended(code)
        return not self._over

    @property
    def _over(self) -> bool:
        """Ended, or known to be ending (its processes not polled: see ``live``)."""
        return self.lost is not None or self.ended

    @property
    def ended(self) -> bool:
        """``end()`` ran (by a stop, the beat's idle end, a lost rank), or is running."""
        return self._ended.is_set()

    def wait_ended(self, timeout: float) -> bool:
        """Whether the session ended within ``timeout`` seconds."""
        return self._ended.wait(timeout)

    @property
    def ended_because(self) -> str:
        """Why the session is over (once it is)."""
        return self.lost or "it was stopped"

    def why_ended(self, code: int) -> str:
        if self.launcher.ended_by is not None:  # "Spark cancelled the run's tasks (...)"
            return self.launcher.ended_by
        if code == SILENT_EXIT:
            return f"its ranks left: they heard nothing from the notebook for {ranks.SILENCE_SECONDS:.0f} s"
        if deaths := self.launcher.deaths():  # rank, host and cause (an OOM kill read from the cgroup)
            return "; ".join(death.said() for death in deaths)
        return f"its processes ended (exit code {code})"

    def left_silent(self) -> bool:
        """Its ranks left because the notebook was silent: none ran a cell sent after that."""
        return self.launcher.poll() == SILENT_EXIT

    def end(self) -> list[str]:
        """Stop every process (and Spark task) of the session; what could not be stopped. A
        second caller (the user's stop while the beat ends an idle session) waits for the first
        to finish (the first says what was left), so that whoever returns from here finds the
        processes stopped. The notebook's interrupt waits until it is done (a slow Spark stop
        cut short left the hub open and the session marked ended)."""
        with self._lock, interrupts_deferred():
            if self._ended.is_set():
                return []
            self._ended.set()
            HISTORY.sessions.pop(id(self), None)
            leftovers = self.launcher.stop()
            if self.hub is not None:
                self.hub.close()
            return leftovers

    # --- cells --------------------------------------------------------------------------

    def run(
        self,
        packed: Packed,
        targets: list[int] | None = None,
        view: RunView | None = None,
        options: RunOptions | None = None,
    ) -> Any:
        """Run a packed cell or function on ``targets`` (all ranks by default); the value of
        the lowest of them, and its returned names. ``options``: the session's, or a copy with
        this cell's ``timeout``, ``timeline`` (rank 0 records it: the session must have been
        started with ``timeline``), ``logdir`` and ``mlflow`` (a run folder, an MLflow run, per cell)."""
        with self.claim():  # SessionEnded if it ended before this cell could claim it
            assert self.hub is not None
            targets = sorted(targets if targets is not None else range(self.size))
            options = options or self.options
            view = view or make_view(self.size)
            for text in packed.notices:
                view.notice(text)
            if options.timeline:
                view.notice(f"timeline of this cell, written to {options.timeline}")
            order = Cell(next(self.cells), targets[0], bool(options.timeline), options.mark_cycles)
            cell = CellLauncher(self, order, targets, packed.blob)
            where = f"live session, {len(targets)} of {self.size} ranks"
            with recorded_sinks(options, where) as sinks:  # TensorBoard, MLflow, the record: this cell's
                sinks.shown_in(view)
                return sinks.returned(CellRun(self.hub, cell, view, options, sinks=sinks).supervise())

    @contextmanager
    def claim(self) -> Iterator[None]:
        """A cell runs (the set-up cell too): not idle; ``idle=`` counts from its end. The claim
        and the beat's idle end hold the session's lock: a cell either claims the session before
        an idle end, which then waits for the cell's end, or finds it ended (``SessionEnded``),
        having run nowhere."""
        with self._lock:
            if self._over:
                raise SessionEnded(f"the live session ended: {self.ended_because}")
            self.running += 1
        try:
            yield
        finally:
            with self._lock:  # the beat sees the cell running, or its end stamped: never between
                self.last_cell = self.clock()
                self.running -= 1

    def dispatch(self, order: Cell, targets: list[int], blob: bytes) -> None:
        """Send the cell to its ranks; for the view they "start" now, as in a run of its own, and
        the others are done with it at once (shown as not in the cell)."""
        assert self.hub is not None
        while not self.hub.events.empty():  # what came in between cells belongs to none
            self.hub.events.get_nowait()
        for rank in range(self.size):
            started = self.ranks[rank].started
            assert started is not None
            self.hub.events.put(Message(started, rank))
            if rank not in targets:  # not in this cell: done with it at once
                self.hub.events.put(Message(Exit(0, skipped=True), rank))
        for rank in targets:
            self.hub.send_to(self.ranks[rank].inbox, order, blob)

    def finished(self, cell: int, ranks: list[int]) -> bool:
        if cell == 0 and not all(self.ranks.get(rank, RankInfo()).inbox for rank in ranks):
            return False  # set up, but not yet reachable for cells
        return set(ranks) <= self.done.get(cell, set())

    def interrupt(self, cell: int, ranks: list[int]) -> None:
        assert self.hub is not None
        for rank in ranks:  # a rank not heard from yet (a slow executor at the start) has no inbox
            if (info := self.ranks.get(rank)) is not None:
                self.hub.send_to(info.inbox, Interrupt(cell))

    def refresh(self, timeout: float = 2.0) -> None:
        """Ask every rank for its figures now and wait (up to ``timeout``) for the answers."""
        assert self.hub is not None
        with self._answered:
            asked = {rank: info.answers for rank, info in self.ranks.items()}
        for info in list(self.ranks.values()):
            self.hub.send_to(info.inbox, Beat())
        with self._answered:
            self._answered.wait_for(
                lambda: all(self.ranks[rank].answers > count for rank, count in asked.items()), timeout
            )

    # --- what the ranks say (on the hub's thread) --------------------------------------

    def _started(self, message: Message) -> Message:
        assert isinstance(message.record, Started)
        self.ranks.setdefault(message.rank, RankInfo()).started = message.record
        return message

    def _cell_done(self, message: Message) -> Message:
        assert isinstance(message.record, CellDone)
        self.done.setdefault(message.record.id, set()).add(message.rank)
        return Message(Exit(0 if message.record.ok else 1), message.rank)  # the cell's end, for Run

    def _status(self, message: Message) -> Message:
        assert isinstance(message.record, RankStatus)
        with self._answered:
            info = self.ranks.setdefault(message.rank, RankInfo())
            info.inbox, info.status = message.identity, message.record
            info.answers += 1
            self._answered.notify_all()
        return message  # on to the cell's run: its record and view

    def beat(self) -> None:
        """The session's beat, until it ends (``start`` runs it on a thread of its own): polls the
        processes, ends the session once they ended or after ``idle=`` without a cell, and beats
        the ranks."""
        while not self._ended.wait(ranks.beat_interval()):
            live = self.live  # polls the processes, and says why the session ended if it did
            with self._lock:  # no cell claims the session between this check and the end
                if not live and not self.running:  # its processes ended: its hub and beat too
                    self.end()
                    return
                if self.idle and not self.running and self.clock() - self.last_cell > self.idle:
                    self.lost = f"idle for {self.idle:g} s (idle=)"
                    self.end()
                    return
            assert self.hub is not None
            for info in list(self.ranks.values()):
                if info.inbox:
                    self.hub.send_to(info.inbox, Beat())
