"""Waits timed on a device (``device_waits``, DDP on a CUDA GPU). There is no GPU here: the
events are the test's own (the ``Event`` interface: a mark, whether the device has passed it,
the time between two), stamped by the host's clock and "passed" when the test says. The DDP
hook they time is the one a GPU model gets, run for real on two torch.distributed ranks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hvd_magic.options import make_options
from hvd_magic.rank.device_waits import DeviceWaits
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks

from .helpers import RecordingView


class Mark:
    """A device event: passed only once the test lets the device run (``Mark.passed``)."""

    passed = False
    reads = 0

    def record(self, stream: object = None) -> None:
        assert stream is None  # on the CPU, DDP's buckets have no stream
        self.at = time.perf_counter()

    def query(self) -> bool:
        return Mark.passed

    def elapsed_time(self, end: Mark) -> float:
        assert Mark.passed, "an event was read before the device passed it: that read would block"
        Mark.reads += 1
        if getattr(end, "elsewhere", False):
            raise RuntimeError("Both events must be recorded on the same device")  # as CUDA says
        return (end.at - self.at) * 1000.0


def test_a_wait_counts_once_the_device_has_passed_its_end_and_never_blocks():
    Mark.passed, Mark.reads = False, 0
    waits = DeviceWaits(Mark)
    for _ in range(3):
        start = waits.begin()
        time.sleep(0.01)
        waits.end(start)
    assert waits() == 0.0 and waits.in_flight() == 3  # queued, not yet run: not counted, not waited for
    Mark.passed = True
    assert 0.03 <= waits() < 10 and waits.in_flight() == 0
    assert waits() == waits() and Mark.reads == 3  # each pair counted once


def test_waits_are_settled_as_new_ones_come_so_a_rank_that_never_reports_keeps_none():
    """... and the events read are recorded again, not made afresh each step."""
    Mark.passed, made = True, []
    waits = DeviceWaits(lambda: made.append(Mark()) or made[-1])
    for _ in range(1000):
        waits.end(waits.begin())
    assert waits.in_flight() == 0 and len(made) <= 3


class Elsewhere(Mark):
    """An end recorded on another device than its start."""

    elsewhere = True


class Broken(Mark):
    """An end whose device failed (its query raises, as CUDA's does after a fault)."""

    def query(self) -> bool:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_pair_that_cannot_be_read_is_dropped_and_the_others_still_count():
    Mark.passed = False
    made = iter([Mark, Elsewhere, Mark, Broken, Mark, Mark])  # (start, end) of three pairs
    waits = DeviceWaits(lambda: next(made)())
    for _ in range(3):
        start = waits.begin()
        time.sleep(0.01)
        waits.end(start)
    Mark.passed = True
    assert 0.01 <= waits() < 10 and waits.in_flight() == 0


DDP_ON_DEVICE = """import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_ddp
from hvd_magic.rank.device_waits import DeviceWaits
from tests.test_device_waits import Mark

dist.init_process_group("gloo")
rank = dist.get_rank()
def model():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 1)]
    return DDP(torch.nn.Sequential(*layers), bucket_cap_mb=0.1)  # a bucket per layer
collective_ddp.time_ddp()  # as in a rank with stragglers on
plain, marked = model(), model()
waits = DeviceWaits(Mark)
collective_ddp.time_on_device(marked, waits)
x = torch.full((4, 256), rank + 1.0)
for _ in range(3):
    plain(x).sum().backward()
    if rank == 1:
        time.sleep(0.5)  # the straggler: rank 0 waits for it in the allreduce
    marked(x).sum().backward()
queued, counted_before = waits.in_flight(), waits()
Mark.passed = True
waited = [None, None]
dist.all_gather_object(waited, waits())
same = all(torch.allclose(a.grad, b.grad) for a, b in zip(plain.parameters(), marked.parameters()))
hooks = marked._get_ddp_logging_data().get("comm_hook")
import copy, pickle
copies = len(pickle.dumps(marked)) > 0 and copy.deepcopy(marked) is not marked
(queued, counted_before, waits.in_flight(), waited, same, hooks, copies)
"""


def test_ddp_on_a_device_marks_one_wait_a_step_and_the_waiting_rank_waits_longer():
    """A DDP model timed by device events trains as without them, with DDP's own allreduce (no
    communication hook); each step timed marks one wait, whatever its buckets; none counts while the
    device has not passed it; then the rank that waited for the slow one counts the longer
    wait. The timed model pickles and copies as DDP does."""
    checkout = str(Path(__file__).resolve().parents[1])  # the ranks import this file's Mark
    options = make_options(np=-2, backend="torch", stragglers="off", env={"PYTHONPATH": checkout})
    result, _ = run_on_ranks(pack_cell(DDP_ON_DEVICE, {}), options, RecordingView())
    queued, counted_before, left, waited, same, hooks, copies = result
    assert queued == 3  # one mark per step, of three buckets
    assert counted_before == 0.0 and left == 0
    assert waited[0] >= 0.75 and waited[0] > waited[1]  # rank 0 waited ~1.5 s for rank 1
    assert same and hooks is None  # the gradients are those of DDP, by DDP's own allreduce
    assert copies  # a timed model pickles and copies as DDP does


@pytest.fixture(autouse=True)
def _fresh_marks() -> None:
    Mark.passed, Mark.reads = False, 0
