"""A stop is complete when the cell returns: after RunInterrupted, RankFailedError and RunTimeout
no process of the run exists anywhere on the machine, checked at once, with no grace. (The same
on Spark is in test_launch_spark.py.)"""

from __future__ import annotations

import os
import signal
import time

import pytest

from hvd_magic import RankFailedError, RunInterrupted, RunTimeout
from hvd_magic.run import supervisor

from .helpers import placed_ranks, run_processes_anywhere, waiting_cell, when_started

FAILING_CELL = (
    "import time, horovod.torch as hvd, torch\nhvd.init()\n"
    "if hvd.rank() == 1:\n    raise ValueError('bad shard')\n"
    "signal_ignored = __import__('signal').signal(2, __import__('signal').SIG_IGN)\n"  # rank 0 resists SIGINT
    "hvd.allreduce(torch.ones(1))\n"
)


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_nothing_is_left_when_an_interrupted_cell_returns(ip, tmp_path, launcher):
    """The ranks ignore SIGINT and SIGTERM: only the escalation to SIGKILL stops them (Gloo's are
    the kernel's own children, with no mpirun to die), and it is bounded."""
    interrupted: list[float] = []

    def interrupt() -> None:
        interrupted.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    when_started(tmp_path, 2, interrupt)
    with pytest.raises(RunInterrupted):
        ip.run_cell_magic(
            "horovod", f"np=-2 launcher={launcher}", waiting_cell(tmp_path, ignore_signals=True)
        )
    assert interrupted and time.monotonic() - interrupted[0] < 20
    assert run_processes_anywhere() == []


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_nothing_is_left_when_a_failed_cell_returns(ip, launcher):
    with pytest.raises(RankFailedError):
        ip.run_cell_magic("horovod", f"np=-2 launcher={launcher}", FAILING_CELL)
    assert run_processes_anywhere() == []


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_nothing_is_left_when_a_timed_out_cell_returns(ip, tmp_path, launcher):
    with pytest.raises(RunTimeout) as timed_out:
        ip.run_cell_magic(
            "horovod", f"np=-2 launcher={launcher} timeout=3", waiting_cell(tmp_path, ignore_signals=True)
        )
    assert run_processes_anywhere() == []
    # the error says where each rank was: in the cell (its sleep), each rank answering
    placed = placed_ranks(str(timed_out.value), "at the timeout")
    assert sorted(placed) == [0, 1] and all("of the cell" in where for where in placed.values()), placed


def test_an_interrupt_of_a_quiet_run_says_where_each_rank_was(ip, tmp_path, monkeypatch):
    """An interrupt of a run that had gone quiet (no message for QUIET_SECONDS; here any run is)
    says where each rank was when it came, before the ranks are stopped."""
    monkeypatch.setattr(supervisor, "QUIET_SECONDS", 0.0)
    when_started(tmp_path, 2, lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(RunInterrupted) as info:
        ip.run_cell_magic("horovod", "np=-2 launcher=gloo", waiting_cell(tmp_path))
    placed = placed_ranks(str(info.value), "when interrupted")
    assert sorted(placed) == [0, 1] and all("of the cell" in where for where in placed.values()), placed
    assert run_processes_anywhere() == []
