"""A live session's rank (``%horovod start``): it runs the set-up cell, then each cell the
notebook sends, one after another, in this process's namespace, so that what one cell defines
the next one finds. It stops when its process is told to (the launcher's stop) or when the
notebook has been silent for the session's limit (a notebook that died sends no ``Beat``).

Interrupts: the notebook's ``Interrupt`` raises KeyboardInterrupt in the cell it names, and
only there. The receiving thread sends this process a real SIGINT (a ``time.sleep`` wakes up);
the handler raises only while the user's code runs (``rank_run.user_call`` is on the stack), so
an interrupt that comes as a cell ends can never land in the loop between cells.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

from hvd_magic.protocol import (
    SILENT_EXIT,
    Cell,
    CellDone,
    CellPayload,
    FunctionPayload,
    PostMortem,
    Result,
    SessionPayload,
)
from hvd_magic.rank import checkpoints, debugger, reporting
from hvd_magic.rank.cell_timeline import CellTimeline
from hvd_magic.rank.hub_client import HubClient
from hvd_magic.rank.inbox import Inbox
from hvd_magic.rank.payload import report_error, run_payload, user_call

__all__ = ["serve"]


def _in(code: types.CodeType, frame: types.FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _in_user_code(frame: types.FrameType | None) -> bool:
    return _in(user_call.__code__, frame)


RETAKE_SECONDS = 0.01  # an interrupt that came while a message was being sent: taken again after


def _sigint_handler(inbox: Inbox) -> Callable[[int, types.FrameType | None], None]:
    def handle(signum: int, frame: types.FrameType | None) -> None:
        if _in(HubClient.send.__code__, frame):  # between a message's frames: it would be cut in two
            threading.Timer(RETAKE_SECONDS, os.kill, (os.getpid(), signal.SIGINT)).start()
            return
        if inbox.interrupting:  # ours: for one cell, and only while its code runs
            cell, inbox.interrupting = inbox.interrupting, 0
            if cell == inbox.busy and _in_user_code(frame):
                raise KeyboardInterrupt
            return
        raise KeyboardInterrupt  # from outside (the launcher stops the rank)

    return handle


class Namespace:
    """The rank's kept namespace (its ``__main__``, as for a cell of a run). A name a session
    cell assigned belongs to the ranks from then on: the notebook's value of the same name,
    shipped with a later cell, does not overwrite it; the notebook's other names fill in."""

    def __init__(self) -> None:
        self.names = sys.modules["__main__"].__dict__
        self.owned: set[str] = set()

    def prepare(self, payload: Any) -> Any:
        if isinstance(payload, CellPayload):
            self.names.update({k: v for k, v in payload.namespace.items() if k not in self.owned})
            payload.namespace = {}
        elif isinstance(payload, FunctionPayload):  # its globals are the kept namespace
            function = payload.function
            inner = getattr(function, "__func__", None)
            if isinstance(function, types.MethodType) and isinstance(inner, types.FunctionType):
                payload.function = types.MethodType(self._kept(inner), function.__self__)  # bound again
            elif isinstance(function, types.FunctionType):
                payload.function = self._kept(function)
            # else a partial, a callable object: called as it is, with its own globals
        self._before = {name: id(value) for name, value in self.names.items()}
        return payload

    def _kept(self, function: types.FunctionType) -> types.FunctionType:
        """``function`` with the kept namespace for its globals (all else as it was: keyword-only
        defaults, attributes, its qualified name)."""
        self.names.update({k: v for k, v in function.__globals__.items() if k not in self.owned})
        kept = types.FunctionType(
            function.__code__, self.names, function.__name__, function.__defaults__, function.__closure__
        )
        kept.__kwdefaults__, kept.__qualname__ = function.__kwdefaults__, function.__qualname__
        kept.__dict__.update(function.__dict__)
        return kept

    def settle(self) -> None:
        """After a cell: what it assigned is the ranks' own."""
        self.owned |= {name for name, value in self.names.items() if self._before.get(name) != id(value)}


def serve(
    client: HubClient, inbox: Inbox, payload: SessionPayload, rank: int, host: str, sync: Callable[[], None]
) -> int:
    """Run the set-up cell, then the notebook's cells until told to stop; the exit code.
    ``client`` is the rank's connection for what cells send; ``inbox`` receives the cells."""
    signal.signal(signal.SIGINT, _sigint_handler(inbox))
    loop = _Loop(inbox, client, host, sync)
    if not loop.run_one(payload.first, 0, reply=rank == 0):
        return 1  # the set-up failed: the notebook says why and stops the session
    while (item := inbox.cells.get()) is not None:
        cell, blob = item
        try:
            loaded: Any = cloudpickle.loads(blob)
        except Exception as err:  # noqa: BLE001 - a cell whose names this rank cannot load
            loaded = err
        recorded = cell if rank == 0 and cell.timeline else None  # Horovod's coordinator writes it
        loop.run_one(loaded, cell.id, reply=rank == cell.reply, timeline=recorded)
    return SILENT_EXIT if inbox.gone else 0


class _Loop:
    def __init__(self, inbox: Inbox, client: HubClient, host: str, sync: Callable[[], None]) -> None:
        self.inbox, self.client, self.host, self.sync = inbox, client, host, sync
        self.namespace = Namespace()

    def run_one(self, payload: Any, cell: int, reply: bool, timeline: Cell | None = None) -> bool:
        """Run one cell; its end (``CellDone``) is sent after all it printed (and, when
        ``timeline`` asks for it on this rank 0, after its timeline)."""
        self.inbox.busy = cell
        if not isinstance(payload, PostMortem):
            debugger.forget()  # a failure is debugged until the next cell
            checkpoints.new_cell()  # and a stop was the last cell's
        try:
            if isinstance(payload, PostMortem):
                ok = self._post_mortem(reply)
            elif isinstance(payload, BaseException):
                report_error(self.client, self.host, payload)
                ok = False
            else:
                ok = self._run(payload, reply, timeline)
        finally:
            self.inbox.busy = 0
        self.inbox.finished += 1
        reporter = reporting.current()
        if reporter is not None:
            reporter.settle()  # the cell's last reports (and files) before its end
        self.sync()
        self.client.send(CellDone(cell, ok))
        return ok

    def _post_mortem(self, reply: bool) -> bool:
        said = debugger.post_mortem()
        if reply:
            self.client.send(Result(), cloudpickle.dumps((said, {})))
        return True

    def _run(self, payload: Any, reply: bool, timeline: Cell | None) -> bool:
        try:
            recording = CellTimeline(self.client, timeline.mark_cycles) if timeline is not None else None
        except Exception as err:  # noqa: BLE001 - the cell's error: the session goes on
            report_error(self.client, self.host, err)
            return False
        try:
            prepared = self.namespace.prepare(payload)
        except Exception as err:  # noqa: BLE001 - the cell's error: the session goes on
            report_error(self.client, self.host, err)
            prepared = None
        try:
            ok = prepared is not None and run_payload(self.client, prepared, self.host, reply=reply) == 0
            self.namespace.settle()
        finally:
            if recording is not None:
                recording.finish()
        return ok
