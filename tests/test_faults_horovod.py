"""Horovod's own failure modes, caused for real on local ranks: a stall (ranks submit different
tensors), uneven work (a rank finishes while another still communicates), an early sys.exit(0)."""

from __future__ import annotations

import re

import pytest

from hvd_magic import RankFailedError, RunTimeout
from hvd_magic.options import make_options
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks
from hvd_magic.widgets.state import RunModel

from .helpers import RecordingView, leftover_processes

STALL_CELL = """
import time, horovod.torch as hvd, torch
hvd.init()
if hvd.rank() == 1:
    hvd.allreduce(torch.ones(2), name="t3")   # rank 0 never submits t3
else:
    time.sleep(600)
"""

UNEVEN_CELL = """import horovod.torch as hvd, torch
hvd.init()
for step in range(3 + hvd.rank()):            # rank 0: 3 steps, rank 1: 4
    hvd.allreduce(torch.ones(2), name=f"t{step}")
"""


def test_a_stall_is_shown_live_and_named_by_the_timeout():
    view = RecordingView()
    # timeout= is not the feature: long enough for the ranks to start and Horovod's stall check
    # (every 2 s here) to speak on a loaded machine (10 s was not, once)
    options = make_options(np=-2, env="HOROVOD_STALL_CHECK_TIME_SECONDS=2", timeout=30)
    with pytest.raises(RunTimeout) as info:
        run_on_ranks(pack_cell(STALL_CELL, {}), options, view)
    message = str(info.value)
    assert "no rank reported anything for 30 s" in message
    assert "stalled: rank 0 never submitted allreduce.t3 (rank 1 waiting over" in message
    model, seen = RunModel(2), []
    for item in view.messages:
        model.apply(item)
        seen.append((model.progress[0].state, tuple(model.progress[0].stalled_on)))
    assert ("stalled", ("allreduce.t3",)) in seen
    # when it was declared stalled, the view was told where each rank was
    (told,) = [text for text in view.notices if "Where each rank was at the stall:" in text]
    assert re.search(r"^rank 0 on [^:]+: in line 7 of the cell$", told, re.M), told
    assert re.search(r"^rank 1 on [^:]+: in \w+ \(mpi_ops\.py:\d+\), from line 5 of the cell$", told, re.M)
    assert "at the timeout:" in message  # and the timeout said it again
    logs = b"".join(m.blob for m in view.messages if m.rank == 0)
    assert b"stall_inspector" not in logs  # the warning became a Stall message, not log text
    assert leftover_processes() == []


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_uneven_work_names_the_finished_rank_and_the_collective_still_running(ip, launcher):
    with pytest.raises(RankFailedError) as info:
        ip.run_cell_magic("horovod", f"np=-2 launcher={launcher}", UNEVEN_CELL)
    message = str(info.value).split("\n")[0]
    assert info.value.rank == 1
    assert "uneven work: rank 0 finished while rank 1 was still in a collective" in message
    assert 'hvd.allreduce(torch.ones(2), name=f"t{step}") at line 4 of the cell' in message
    assert "hvd.join()" in message and "same number of batches" in message
    assert leftover_processes() == []


def test_sys_exit_0_on_a_rank_is_a_normal_end(ip):
    cell = (
        "import sys, horovod.torch as hvd\nhvd.init()\nif hvd.rank() == 1:\n    sys.exit(0)\nhvd.rank() + 10"
    )
    assert ip.run_cell_magic("horovod", "np=-2", cell) == 10


def test_sys_exit_0_before_a_collective_is_named_as_uneven_work(ip):
    cell = (
        "import sys, horovod.torch as hvd, torch\nhvd.init()\nif hvd.rank() == 1:\n    sys.exit(0)\n"
        "hvd.allreduce(torch.ones(1), name='late')\n"
    )
    with pytest.raises(RankFailedError, match="uneven work: rank 1 finished while rank 0 was still"):
        ip.run_cell_magic("horovod", "np=-2 launcher=gloo", cell)
