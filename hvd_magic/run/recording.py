"""Every run recorded in the kernel's record (``run.history``) by a sink of its own, from the
messages the view gets; the record served to the Horovod panel once a run began (``run.endpoint``)."""

from __future__ import annotations

import reprlib
import time
from typing import TYPE_CHECKING, Any

from hvd_magic.protocol import Log, Message
from hvd_magic.run.endpoint import serve_in_kernel, serving, tab_view
from hvd_magic.run.history import HISTORY, RunEntry
from hvd_magic.sinks import Sinks, make_sinks
from hvd_magic.widgets.render import final_html
from hvd_magic.widgets.state import RunModel

if TYPE_CHECKING:
    from hvd_magic.options import RunOptions

__all__ = ["RecordingSink", "recorded_sinks"]


class RecordingSink:
    """Folds a run's messages (not its output: the summary needs none) into its entry's model,
    or reads the live view's model, which folds them already (``shown_in``: folding them twice
    took the kernel's share of a core under 64 ranks' reports from 0.22 to 0.40); at the end
    keeps the outcome, the summary, and rank 0's value (``returned``)."""

    def __init__(self, entry: RunEntry) -> None:
        self.entry = entry
        self.folds = True

    def shown_in(self, view: object) -> None:
        model = getattr(view, "model", None)
        if isinstance(model, RunModel):
            self.entry.model, self.folds = model, False

    def message(self, message: Message) -> None:
        if self.folds and self.entry.model is not None and not isinstance(message.record, Log):
            self.entry.model.apply(message)

    def supervising(self, run: Any) -> None:
        """The attempt's ``run.supervisor.Run``: what launched it (the entry's ``launcher``), and what
        the panel's stop and stacks act on."""
        from hvd_magic.run.stacks import where_now

        record, launcher = run.record, run.launcher
        self.entry.launcher = launcher.describe()  # each attempt's launcher: a retry's is a new one
        self.entry.stop = run.stopper.interrupt
        self.entry.stacks = lambda: where_now(
            run.hub, run.options.ranks, record.started, record.pids, launcher.native_stacks
        )

    def returned(self, value: tuple[Any, dict[str, Any]]) -> None:
        """A run's result: rank 0's value and the names it returns (``return=``)."""
        self.entry.value, self.entry.has_value = value[0], True
        self.entry.value_text = reprlib.repr(value[0])

    def close(self, outcome: BaseException | None) -> None:
        entry, model = self.entry, self.entry.model
        entry.ended = time.time()
        if outcome is None:
            entry.outcome = "finished"
        else:
            first = str(outcome).strip().splitlines()[:1]
            entry.outcome = f"{type(outcome).__name__}: {first[0] if first else ''}".rstrip(": ")
        if model is not None:
            model.end()
            with model.lock:
                entry.summary, entry.final = model.summary(), final_html(model)
                if serving():  # the panel's tab of an ended run: only where a panel may ask
                    entry.views = {every: tab_view(model, every) for every in (False, True)}
        entry.model = entry.stop = entry.stacks = None  # its series, logs and run go; the record stays


def recorded_sinks(options: RunOptions, where: str | None = None) -> Sinks:
    """The sinks ``options`` ask for (``make_sinks``) and the kernel's record of the run, closed
    first: its end is the run's, not MLflow's upload of the timeline after it."""
    sinks = make_sinks(options)
    sinks.sinks = {
        "the kernel's record of its runs": RecordingSink(HISTORY.begin(options, where)),
        **sinks.sinks,
    }
    serve_in_kernel(HISTORY)
    return sinks
