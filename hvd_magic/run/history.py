"""The kernel's record of its runs, kept whatever watched them (issue 78).

A browser tab closed mid-run gets none of what the kernel sent meanwhile: neither the run's
final record nor rank 0's value. So every run (a cold cell, a live session's cell, a
``HorovodRunner`` or ``TorchDistributor`` call, an estimator's fit) is also recorded here, from
the same messages the view gets (a sink: ``run.recording``): what ran, on how many ranks, when,
how it ended, its summary line, and rank 0's value. The last ``KEEP`` are kept in the kernel;
``%horovod runs`` lists them, ``%horovod last`` (or ``runs N``) shows one and returns its value.
In a Jupyter kernel the record is also served to the server's Horovod panel (``run.endpoint``),
which can stop a running run and ask for its ranks' stacks through the entry (``supervising``).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hvd_magic.widgets.state import RunModel

if TYPE_CHECKING:
    from hvd_magic.options import RunOptions

__all__ = ["HISTORY", "History", "RunEntry"]

KEEP = 10  # runs kept, with their values (a value may be a model: the oldest go first)


@dataclass
class RunEntry:
    """One run: its number in this kernel, what it ran on, when, how it ended, its final record."""

    number: int
    where: str  # "2 local ranks", "4 ranks on Spark", "live session"
    ranks: int
    started: float  # time.time()
    ended: float | None = None
    outcome: str = "running"  # "finished", or the error it ended with
    summary: str = ""  # the view's final line: ranks, seconds, the latest metrics
    launcher: str = ""  # what launched it (``Launcher.describe``): "Spark yarn · Horovod (mpirun)"
    value: Any = None
    has_value: bool = False
    cell: str = ""  # the notebook cell's id, where JupyterLab sent it (the panel marks that cell)
    timeline: str = ""  # where the run writes its Horovod Timeline (timeline=), for the panel's tab
    value_text: str = ""  # the value's repr, shortened (for the panel: made here, on the kernel's thread)
    final: str = field(default="", repr=False)  # the final record's HTML, as the view kept it
    # the panel tab's view of the run once ended: its record's HTML without curves, and the curves'
    # plotly traces, with every rank's row and line (True) or not (False)
    views: dict[bool, tuple[str, dict[str, Any]]] = field(default_factory=dict, repr=False)
    model: RunModel | None = field(default=None, repr=False)  # while it runs
    stop: Callable[[bool], None] | None = field(default=None, repr=False)  # while supervised: (at_once)
    stacks: Callable[[], str] | None = field(default=None, repr=False)  # ... every rank's stacks, told

    @property
    def seconds(self) -> float:
        return (self.ended or time.time()) - self.started

    def line(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.started))
        return f"{self.number:>3}  {when}  {self.seconds:7.1f} s  {self.where:<22}  {self.outcome}"

    def record(self) -> str:
        """What ``%horovod last`` prints: the run's line, what launched it, its summary, whether it
        has a value."""
        value = "rank 0's value: returned" if self.has_value else "no value (it did not finish)"
        launched = [f"launched by {self.launcher}"] if self.launcher else []
        head = f"run {self.number}, {self.where}: {self.outcome}"
        return "\n".join([head, *launched, f"hvd_magic: {self.summary}", value])


class History:
    """The kernel's last ``KEEP`` runs, oldest first."""

    def __init__(self, keep: int = KEEP) -> None:
        self.entries: deque[RunEntry] = deque(maxlen=keep)
        self.count = 0
        self.sessions: dict[int, Callable[[], dict[str, Any]]] = {}  # live sessions: their panel rows

    def begin(self, options: RunOptions, where: str | None = None) -> RunEntry:
        self.count += 1
        spread = "local" if options.np < 0 else "on Spark"
        entry = RunEntry(self.count, where or f"{options.ranks} ranks {spread}", options.ranks, time.time())
        entry.cell, entry.timeline = running_cell(), options.timeline or ""
        entry.model = RunModel(options.ranks)
        self.entries.append(entry)
        return entry

    def get(self, number: int | None = None) -> RunEntry | None:
        """Run ``number`` (None: the last one) if it is still kept."""
        entries = list(self.entries)  # a copy: the panel's thread asks while the kernel's appends
        if number is None:
            return entries[-1] if entries else None
        return next((entry for entry in entries if entry.number == number), None)

    def table(self) -> str:
        if not self.entries:
            return "no runs yet in this kernel"
        head = "  #  started   seconds  ran on                  outcome"
        return "\n".join([head, *(entry.line() for entry in self.entries)])


HISTORY = History()


def running_cell() -> str:
    """The id of the notebook cell the kernel runs now, as JupyterLab sends it with the request
    (``cellId``); "" outside a Jupyter kernel or from a front end that does not say."""
    ipython = sys.modules.get("IPython")
    kernel = getattr(ipython.get_ipython(), "kernel", None) if ipython is not None else None
    try:
        request = kernel.get_parent("shell") if kernel is not None else {}
    except (AttributeError, TypeError):  # an older ipykernel
        return ""
    return str(((request or {}).get("metadata") or {}).get("cellId") or "")
