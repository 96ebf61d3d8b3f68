"""One cell of a live session, run by ``run.supervisor.Run`` as if it were a run of its own.

``CellLauncher`` is the launcher ``Run`` drives: ``start`` sends the cell to its ranks (the
first cell, the set-up, starts the session's processes instead), ``poll`` is 0 once each of them
said it finished the cell, and ``stop`` (after an error or an interrupt) asks the ranks still in
the cell to stop it; a rank that does not (stuck inside a collective that another rank never
joined) ends the session, and the next cell starts a new one. So the view, the errors and
their diagnosis are a run's, unchanged.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from hvd_magic.errors import RunError, RunInterrupted
from hvd_magic.launch import Launcher, RankDeath
from hvd_magic.protocol import SILENT_EXIT, Cell
from hvd_magic.run.stacks import where_each_rank
from hvd_magic.run.supervisor import Run
from hvd_magic.session import ranks
from hvd_magic.session.ranks import hosts_and_pids

if TYPE_CHECKING:
    from hvd_magic.hub import Hub
    from hvd_magic.session.ranks import RankInfo


class LiveSession(Protocol):
    """What a cell needs of its session (``live.LiveSession``)."""

    launcher: Launcher
    lost: str | None
    ranks: dict[int, RankInfo]

    def dispatch(self, order: Cell, targets: list[int], blob: bytes) -> None: ...

    def finished(self, cell: int, ranks: list[int]) -> bool: ...

    def interrupt(self, cell: int, ranks: list[int]) -> None: ...

    def end(self) -> list[str]: ...

    def why_ended(self, code: int) -> str: ...


__all__ = ["CELL_STOP_SECONDS", "CellLauncher", "CellRun"]

CELL_STOP_SECONDS = 3.0  # how long ranks get to leave an interrupted or failed cell


class CellLauncher(Launcher):
    def __init__(self, session: LiveSession, order: Cell, targets: list[int], blob: bytes) -> None:
        self.session, self.order, self.targets, self.blob = session, order, targets, blob
        self.cell = order.id
        self.bind_host = session.launcher.bind_host
        self.broke: str | None = None  # why the session had to end, if it had to
        self.hub: Hub | None = None

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        self.hub = hub
        if self.cell == 0:
            self.session.launcher.start(hub, env)  # the ranks run the set-up cell first
        else:
            self.session.dispatch(self.order, self.targets, self.blob)

    def poll(self) -> int | None:
        code = ranks.ended(self.session.launcher)
        if code is not None:  # a rank's process ended: the session is over
            self.session.lost = self.session.why_ended(code)
            if code == SILENT_EXIT:  # not a death: they left before this cell came
                raise RunError(f"the live session ended: {self.session.lost}")
            return code if code else 1
        return 0 if self.session.finished(self.cell, self.targets) else None

    def stop(self) -> list[str]:
        if self.session.finished(self.cell, self.targets) or self.session.lost:
            return [] if not self.session.lost else self.session.end()
        left = [rank for rank in self.targets if not self.session.finished(self.cell, [rank])]
        self.session.interrupt(self.cell, left)
        deadline = time.monotonic() + CELL_STOP_SECONDS
        while time.monotonic() < deadline and self.session.launcher.poll() is None:
            if self.session.finished(self.cell, self.targets):
                return []
            time.sleep(0.05)
        stuck = [rank for rank in self.targets if not self.session.finished(self.cell, [rank])]
        self.broke = (
            f"rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))} did not leave the cell within "
            f"{CELL_STOP_SECONDS:.0f} s (inside a collective that another rank never joined?)"
        ) + self._where()
        self.session.lost = self.broke
        return self.session.end()

    def _where(self) -> str:
        if self.hub is None:
            return ""
        hosts, pids = hosts_and_pids(self.session.ranks)
        when = "when the session ended"
        return where_each_rank(self.hub, len(self.session.ranks), hosts, pids, self.native_stacks, when)

    def describe(self) -> str:  # the session's launcher: where its ranks run, and how they started
        return self.session.launcher.describe()

    def diagnostics(self) -> str:
        # only when the session's processes ended: a live launcher's output is still being read
        return self.session.launcher.diagnostics() if self.session.launcher.poll() is not None else ""

    def deaths(self) -> list[RankDeath]:
        return self.session.launcher.deaths()

    def said(self) -> list[str]:
        return self.session.launcher.said()

    @property
    def ended_by(self) -> str | None:  # what stopped the session's run from outside (a Spark cancel)
        return self.session.launcher.ended_by

    @ended_by.setter
    def ended_by(self, value: str | None) -> None:
        self.session.launcher.ended_by = value

    def native_stacks(self, pids: dict[int, int], hosts: dict[int, str]) -> dict[int, str]:
        return self.session.launcher.native_stacks(pids, hosts)


class CellRun(Run):
    """``Run`` for a live session's cell: the hub is the session's, and its end is the cell's."""

    keeps_hub = True
    beats = False  # the session beats its ranks itself
    launcher: CellLauncher

    def _interrupted(self) -> RunInterrupted:
        return RunInterrupted("interrupted: the cell was stopped on its ranks.")

    def supervise(self) -> Any:
        try:
            return super().supervise()
        except BaseException as err:
            if self.launcher.session.lost:
                err.add_note(
                    f"the live session ended: {self.launcher.session.lost}. Its state is lost; the next "
                    "%%horovod cell starts a new session (%horovod stop frees its slots now)."
                )
            elif isinstance(err, RunInterrupted):
                err.add_note("The session's state is kept: what the cell did before the interrupt stays.")
            raise
