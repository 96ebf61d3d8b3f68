"""A straggler, for real: two local ranks (backend=torch, so no Horovod to start) report their
steps with ``hvd_magic.report``; rank 1 sleeps a second a step until the view has named it, then
keeps pace. The view names rank 1 once, with its host and a likely reason, then says it caught
up; the run's record keeps both. The view itself flips the ranks' switches (files), so the test
waits on the run's own events, with generous bounds (the rule is short: 50 % for 2 s)."""

from __future__ import annotations

from pathlib import Path

from hvd_magic.capture import capture_cell
from hvd_magic.engine import execute
from hvd_magic.options import make_options
from hvd_magic.protocol import Message, Started, Straggler

from .helpers import RecordingView, leftover_processes

CELL = """import os, pathlib, time, hvd_magic
switches = pathlib.Path({folder!r})
rank, step, deadline = int(os.environ["RANK"]), 0, time.time() + 300
while not (switches / "stop").exists() and time.time() < deadline:
    slowed = rank == 1 and not (switches / "recover").exists()
    time.sleep(1.0 if slowed else 0.05)
    step += 1
    hvd_magic.report(step=step)
step
"""

REASONS = ("data wait", "CPU saturated", "memory swapping", "GPU busy")


class SwitchingView(RecordingView):
    """Lets rank 1 recover once it is named, and stops both ranks once it has caught up."""

    def __init__(self, switches: Path) -> None:
        super().__init__()
        self.switches = switches

    def message(self, message: Message) -> None:
        super().message(message)
        if isinstance(message.record, Straggler):
            (self.switches / ("stop" if message.record.recovered else "recover")).touch()

    def stragglers(self) -> list[Straggler]:
        return [m.record for m in self.messages if isinstance(m.record, Straggler)]

    def host(self, rank: int) -> str:
        return next(m.record.host for m in self.messages if isinstance(m.record, Started) and m.rank == rank)


def test_a_slowed_rank_is_named_with_its_host_and_reason_then_cleared(tmp_path):
    view = SwitchingView(tmp_path)
    options = make_options(-2, backend="torch", stragglers="0.5/2")
    steps, _ = execute(capture_cell(CELL.format(folder=str(tmp_path)), {}), options, view)
    said = view.stragglers()  # exactly these two: rank 1 named once, then cleared once
    assert [(s.slow_rank, s.recovered) for s in said] == [(1, False), (1, True)], said
    named, recovered = said
    assert named.host and named.host == view.host(1) == recovered.host
    assert named.reason.startswith(REASONS), named.reason
    assert named.rate < 0.5 * named.median and recovered.rate >= 0.5 * recovered.median
    assert (tmp_path / "stop").exists() and steps > 0  # the run ended because it caught up
    assert leftover_processes() == []
