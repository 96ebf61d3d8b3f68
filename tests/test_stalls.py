"""Horovod's stall warnings taken out of a rank's stderr (pure; the real warning is in
test_faults_horovod.py); torch.distributed waits seen in a real blocked call, and the stall they
make (the real runs are in test_faults_torch.py)."""

from __future__ import annotations

import datetime
import os
import threading

import pytest

from hvd_magic.protocol import CELL_FILENAME, Stall, Waiting
from hvd_magic.rank.stalls import StallFilter, WaitWatch, waiting_in
from hvd_magic.run.stalls import WaitSeen, waiting_stall

WARNING = (
    b"[2026-11-22 23:58:30. 23583: W /tmp/horovod/common/stall_inspector.cc:107] One or more tensors "
    b"were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for "
    b"remainder of ranks for more than 15 seconds. This may indicate that different ranks are trying "
    b"to submit different tensors or that only subset of ranks is submitting tensors, which will "
    b"cause deadlock. \nMissing ranks:\n0: [allreduce.t3, allreduce.t4]\n2: [allreduce.t3]\n"
)


def feed_all(pieces: list[bytes]) -> tuple[bytes, list[Stall]]:
    stalls = StallFilter()
    shown, found = b"", []
    for piece in pieces:
        text, new = stalls.feed(piece)
        shown += text
        found += new
    return shown + stalls.flush(), found


def test_the_warning_becomes_a_stall_and_leaves_the_log():
    shown, found = feed_all([b"epoch 1\n", WARNING, b"epoch 2\n"])
    assert shown == b"epoch 1\nepoch 2\n"
    assert found[-1] == Stall([0, 2], [["allreduce.t3", "allreduce.t4"], ["allreduce.t3"]], 15.0)
    assert found[-1].missing() == (
        "rank 0 never submitted allreduce.t3, allreduce.t4; rank 2 never submitted allreduce.t3"
    )


def test_a_warning_cut_anywhere_is_found_the_same():
    text = b"before\n" + WARNING + b"after\n"
    for cut in range(0, len(text), 7):
        shown, found = feed_all([text[:cut], text[cut:]])
        assert shown == b"before\nafter\n", cut
        assert found[-1].ranks == [0, 2], cut
    shown, found = feed_all([bytes([b]) for b in text])  # a byte at a time
    assert shown == b"before\nafter\n" and found[-1].ranks == [0, 2]


def test_warnings_in_a_row_cut_anywhere_are_all_taken():
    text = WARNING * 3 + b"after\n"
    for size in (1, 5, 64, 333):
        shown, found = feed_all([text[i : i + size] for i in range(0, len(text), size)])
        assert shown == b"after\n", size
        assert len(found) == 6, size  # two rank lines per warning


def test_other_output_is_not_held_back():
    stalls = StallFilter()
    assert stalls.feed(b"50%|#####     | 5/10\r") == (b"50%|#####     | 5/10\r", [])
    assert stalls.feed(b"[1, 2, 3] partial") == (b"[1, 2, 3] partial", [])  # not Horovod's prefix
    assert stalls.feed(b"[2026-11-22 23:58") == (b"", [])  # may be Horovod's: held to the line end
    other = b":30.1: I operations.cc:1] Horovod initialized\n"
    assert stalls.feed(other) == (b"[2026-11-22 23:58" + other, [])


def test_the_warning_block_ends_at_the_first_other_line():
    shown, found = feed_all([WARNING.replace(b"2: [allreduce.t3]\n", b"3: not a rank line\n")])
    assert shown == b"3: not a rank line\n" and found[-1].ranks == [0]


def test_a_stall_is_the_ranks_not_waiting_once_one_waited_long_enough():
    waits = {0: WaitSeen("all_reduce", "line 5 of the cell", 10.0), 2: WaitSeen("all_reduce", "", 12.0)}
    assert waiting_stall(waits, 3, now=24.0, threshold=15) is None  # not long enough yet
    stall = waiting_stall(waits, 3, now=25.0, threshold=15)
    assert stall == Stall([1], [["all_reduce (line 5 of the cell)"]], 15, "reached", "")
    assert stall.missing() == "rank 1 never reached all_reduce (line 5 of the cell)"
    # Rank 1 waits too, in barrier: a mismatch, so rank 1 still never reached all_reduce.
    mismatch = waits | {1: WaitSeen("barrier", "line 7 of the cell", 11.0)}
    assert waiting_stall(mismatch, 3, now=99.0, threshold=15) == stall
    same = waits | {1: WaitSeen("all_reduce", "line 9 of the cell", 11.0)}
    assert waiting_stall(same, 3, now=99.0, threshold=15) is None  # all in one (long) call


@pytest.fixture
def blocked_in_init():
    """A thread inside a real init_process_group (cell code, line 2) that waits for a second
    rank that never comes; it gives up after a few seconds."""
    import torch.distributed as dist  # here: collecting the module does not import torch

    store = dist.HashStore()
    cell = 'import datetime\ninit("gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=8))\n'
    code = compile(
        cell,
        CELL_FILENAME,
        "exec",
    )

    def run() -> None:
        try:
            exec(code, {"init": dist.init_process_group, "store": store, "timedelta": datetime.timedelta})
        except Exception:  # noqa: BLE001 - the timeout it is meant to reach
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield thread
    thread.join(timeout=60)


def frame_of(thread: threading.Thread):
    import sys

    return sys._current_frames()[thread.ident]


def test_a_real_wait_in_init_process_group_is_seen_and_told_once(blocked_in_init):
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=30)
    found = None
    while found is None and datetime.datetime.now() < deadline:
        found = waiting_in(frame_of(blocked_in_init))
    assert found is not None and found[1:] == ("init_process_group", "line 2 of the cell")
    sent, now = [], [0.0]
    watch = WaitWatch(sent.append, clock=lambda: now[0])
    watch.sample(frame_of(blocked_in_init))
    now[0] = 1.0
    watch.sample(frame_of(blocked_in_init))
    assert sent == []  # a short wait is not told
    now[0] = 2.5
    watch.sample(frame_of(blocked_in_init))
    now[0] = 3.0
    watch.sample(frame_of(blocked_in_init))
    assert sent == [Waiting("init_process_group", "line 2 of the cell", 2.5)]
    watch.sample(None)  # out of it
    assert sent[1:] == [Waiting()]
    assert waiting_in(frame_of(threading.current_thread())) is None  # this test is not waiting


def test_importing_torch_distributed_is_not_a_wait():
    """A rank slow to import torch.distributed (a loaded machine) is not in a torch.distributed
    call: told as a wait, it hid the rank that was behind (a full run blamed the rank that timed
    out). Frames run as a module under torch/distributed, and its lambdas, are not calls."""
    import sys

    import torch

    path = os.path.join(os.path.dirname(str(torch.__file__)), "distributed", "being_imported.py")
    scope: dict = {"sys": sys}
    exec(compile("module = sys._getframe()\nlate = (lambda: sys._getframe())()\n", path, "exec"), scope)
    assert waiting_in(scope["module"]) is None
    assert waiting_in(scope["late"]) is None
    exec(compile("def barrier():\n    return sys._getframe()\ncall = barrier()\n", path, "exec"), scope)
    assert waiting_in(scope["call"])[1] == "barrier"  # a public function there is a call
