"""Where each rank is, told as one text (pure: ``run.stacks.describe`` over ``RankStacks``); the
real asking of real ranks is in test_session (a live session, %horovod stacks while a cell runs),
test_stop and test_faults_horovod (a timed-out and a stalled run) and test_launch_spark."""

from __future__ import annotations

from hvd_magic.protocol import RankStacks
from hvd_magic.run.stacks import SHOWN_FRAMES, describe

CELL = "<horovod cell>"
WAITING = [[CELL, 12, "<module>", "hvd.allreduce(grad, name='grad.fc1')"],
           ["/site/horovod/torch/mpi_ops.py", 400, "synchronize", "return mpi_lib.wait(handle)"]]  # fmt: skip
LOADING = [[CELL, 9, "<module>", "batch = next(loader)"],
           ["/site/torch/utils/data/dataloader.py", 88, "__next__", "data = self._next_data()"]]  # fmt: skip


def test_ranks_with_the_same_stack_are_shown_once_with_their_hosts():
    answers = {rank: RankStacks(1, main=WAITING) for rank in (0, 2, 3)} | {1: RankStacks(1, main=LOADING)}
    hosts = {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"}
    assert describe(answers, range(4), hosts).splitlines() == [
        "ranks 0, 2, 3 on hostA, hostB: in synchronize (mpi_ops.py:400), from line 12 of the cell",
        "  line 12 of the cell: hvd.allreduce(grad, name='grad.fc1')",
        "  synchronize (mpi_ops.py:400): return mpi_lib.wait(handle)",
        "rank 1 on hostA: in __next__ (dataloader.py:88), from line 9 of the cell",
        "  line 9 of the cell: batch = next(loader)",
        "  __next__ (dataloader.py:88): data = self._next_data()",
    ]


def test_other_threads_are_folded_and_make_stacks_differ():
    answers = {
        0: RankStacks(1, main=LOADING, others=[["prefetch", "get (queue.py:180)"]]),
        1: RankStacks(1, main=LOADING),
    }
    lines = describe(answers, [0, 1]).splitlines()
    assert (
        lines[0].startswith("rank 0: in __next__") and "  thread 'prefetch': in get (queue.py:180)" in lines
    )
    assert any(line.startswith("rank 1: in __next__") for line in lines)


def test_silent_and_idle_ranks_are_said_so_and_deep_stacks_keep_their_innermost_frames():
    deep = [[CELL, 3, "<module>", "train()"]] + [["/lib/m.py", n, f"f{n}", ""] for n in range(20)]
    answers = {0: RankStacks(1, idle=True), 1: RankStacks(1, main=deep)}
    text = describe(answers, range(3))
    assert "rank 0: idle\n  idle: between cells" in text
    assert (
        f"  … {len(deep) - SHOWN_FRAMES} outer frames\n  f{20 - SHOWN_FRAMES} (m.py:{20 - SHOWN_FRAMES})"
        in text
    )
    assert text.splitlines()[-1].startswith(
        "rank 2: no answer (a C call holding Python's lock, or the rank is gone"
    )
