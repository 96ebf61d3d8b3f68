"""torch.distributed's own failure modes, caused for real on local ranks (backend=torch): a rank
that never calls init_process_group, a rank behind when the others time out, a collective after
another rank finished. torch says none of them by name; the run does."""

from __future__ import annotations

import pytest

from hvd_magic import FailureClass, RankFailedError
from hvd_magic.options import make_options
from hvd_magic.protocol import Stall
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks
from hvd_magic.widgets.render import grid_html
from hvd_magic.widgets.state import RunModel

from .helpers import RecordingView, leftover_processes

STALL_ENV = "HOROVOD_STALL_CHECK_TIME_SECONDS=2"

NO_INIT_CELL = """import os, torch.distributed as dist
if os.environ["RANK"] == "1":
    raise SystemExit(0)                      # rank 1 leaves without joining
dist.init_process_group("gloo")
"""

INIT_BEHIND_CELL = """import datetime, os, time, torch.distributed as dist
if os.environ["RANK"] == "1":
    time.sleep(600)                          # rank 1 never calls init_process_group
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
"""

BEHIND_CELL = """import datetime, time, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
if dist.get_rank() == 1:
    time.sleep(600)                          # slow data on rank 1
dist.all_reduce(torch.ones(2))
"""

DDP_BEHIND_CELL = """import datetime, time, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
loss = model(torch.randn(8, 4)).pow(2).mean()
if dist.get_rank() == 1:
    time.sleep(600)
loss.backward()                              # DDP waits here for rank 1's gradients
"""

LATE_CELL = """import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()                               # both ranks past init: rank 0 may finish now
if dist.get_rank() == 1:
    time.sleep(1)
    dist.all_reduce(torch.ones(2))           # rank 0 has finished
"""


def failing_run(cell: str) -> tuple[RecordingView, str]:
    """Runs ``cell`` on 2 local torch ranks; the view and the first line of the error, which
    must name rank 1."""
    view = RecordingView()
    options = make_options(np=-2, backend="torch", env=STALL_ENV)
    with pytest.raises(RankFailedError) as info:
        run_on_ranks(pack_cell(cell, {}), options, view)
    message = str(info.value).split("\n")[0]
    assert info.value.rank == 1, message
    return view, message


def test_a_rank_that_never_calls_init_process_group_is_named_live_and_when_it_leaves():
    view, message = failing_run(NO_INIT_CELL)
    assert "failed: it finished without reaching init_process_group (line 4 of the cell)" in message
    assert "where rank 0 waited over" in message
    stalls = [m.record for m in view.messages if isinstance(m.record, Stall)]
    assert stalls and stalls[0].ranks == [1] and stalls[0].action == "reached"
    model = RunModel(2)
    for item in view.messages:
        if isinstance(item.record, Stall):
            model.apply(item)
    assert "stalled: never reached init_process_group (line 4 of the cell)" in grid_html(model)
    assert leftover_processes() == []


@pytest.mark.parametrize(
    ("cell", "waits_in"),
    [
        (INIT_BEHIND_CELL, "init_process_group (line 4 of the cell)"),
        (BEHIND_CELL, "all_reduce (line 5 of the cell)"),
        (DDP_BEHIND_CELL, "backward (line 7 of the cell)"),
    ],
    ids=["init_process_group", "all_reduce", "ddp-backward"],
)
def test_the_rank_behind_is_named_when_the_others_time_out(cell, waits_in):
    view, message = failing_run(cell)
    assert f"failed: it was behind; rank 0 timed out waiting for it in {waits_in}" in message
    assert "Timed out" in message  # torch's own words come along
    assert any(isinstance(m.record, Stall) and m.record.ranks == [1] for m in view.messages)
    assert leftover_processes() == []


def test_a_collective_after_another_rank_finished_is_uneven_work_and_not_retried(ip):
    with pytest.raises(RankFailedError) as info:
        ip.run_cell_magic("horovod", "np=-2 backend=torch retries=1", LATE_CELL)
    message = str(info.value).split("\n")[0]
    assert info.value.rank == 1, message
    assert "uneven work: rank 0 finished while rank 1 was still in a collective" in message
    assert "dist.all_reduce(torch.ones(2)) at line 6 of the cell" in message
    assert "torch.distributed.algorithms.Join" in message
    assert info.value.failure is FailureClass.CODE  # unequal work would fail again: not retried
    assert not any(note.startswith("attempts: ") for note in getattr(info.value, "__notes__", []))
    assert leftover_processes() == []
