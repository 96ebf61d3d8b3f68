"""``StoppingLate``, the trainers' stop check (issue 79): one allreduce in the background for
about 50 ms of steps, read a few steps later, the ranks agreeing on when (pure: a stand-in for
torch.distributed's one call, one rank; the agreement across real ranks is in test_trainers)."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import pytest
import torch  # noqa: F401 - imported whole before torch.distributed is stood in for

from hvd_magic.rank import checkpoints
from hvd_magic.rank.checkpoints import StoppingLate


class OneRank:
    """torch.distributed as a rank of a world of one sees it: an allreduce is its own tensor."""

    ReduceOp = SimpleNamespace(MAX="max")

    def __init__(self) -> None:
        self.started: list[list[float]] = []  # each allreduce's tensor, as it was started

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_backend(self) -> str:
        return "gloo"

    def all_reduce(self, tensor, op, async_op):
        assert op == "max" and async_op
        self.started.append(tensor.tolist())
        return SimpleNamespace(wait=lambda: None)


@pytest.fixture
def rank(monkeypatch):
    dist = OneRank()
    inbox = SimpleNamespace(stop_asked=threading.Event(), stop_reason="")
    said = []
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setattr(checkpoints.rank_inbox, "current", lambda: inbox)
    monkeypatch.setattr(
        checkpoints.reporting, "current", lambda: SimpleNamespace(client=SimpleNamespace(send=said.append))
    )
    monkeypatch.setattr(checkpoints, "_agreed", False)
    monkeypatch.setattr(checkpoints, "_polling_told", False)
    return SimpleNamespace(dist=dist, inbox=inbox, said=said)


def steps_of(seconds: float):
    """A ``StoppingLate`` asked at the end of steps of ``seconds``: each call a step later."""
    now = [0.0]
    stopping = StoppingLate(lambda: now[0])

    def step() -> bool:
        now[0] += seconds
        return stopping()

    return step


# steps of a power of two of a second: the clock's sums are exact, so is each proposal
@pytest.mark.parametrize(("step", "apart"), [(2**-10, 52), (2**-8, 13), (2**-3, 1), (2**-14, 64)])
def test_fast_steps_share_one_allreduce_and_slow_ones_have_one_each(rank, step, apart):
    stopping = steps_of(step)
    assert not any(stopping() for _ in range(2 + 20 * apart))
    assert len(rank.dist.started) == 2 + 20  # the first two, then one every `apart` calls
    assert rank.dist.started[-1] == [0.0, -float(apart)]  # not asked; the calls it proposes
    assert len(rank.said) == 1  # the notebook heard once that the ranks look


def test_a_stop_lands_within_two_spans_and_stays(rank):
    stopping = steps_of(2**-10)  # 52 calls apart
    for _ in range(120):
        assert not stopping()
    rank.inbox.stop_asked.set()
    calls = 1
    while not stopping():
        calls += 1
    assert calls <= 2 * 52
    assert stopping() and stopping()  # and every call after
