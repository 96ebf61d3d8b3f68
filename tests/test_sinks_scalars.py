"""The ranks' reports as scalar points (pure): per rank as they come, the mean across ranks at
each step once every rank reported it, or after the grace, or at the end."""

from __future__ import annotations

import json
import threading
import time

import hypothesis
import hypothesis.strategies as st

from hvd_magic.protocol import Exit, Message, Reports, Started
from hvd_magic.sinks import run_name
from hvd_magic.sinks.scalars import GRACE_SECONDS, Point, Scalars


def reports(rank: int, *records: dict[str, object]) -> Message:
    return Message(Reports(0), rank, json.dumps(list(records)).encode())


def test_each_rank_as_it_comes_and_the_mean_once_every_rank_reported_the_step():
    scalars = Scalars(ranks=2)
    first = scalars.take(reports(0, {"t": 10.0, "step": 1, "metrics": {"loss": 1.0}}), now=0.0)
    assert first == [Point("loss", 1, 1.0, 10.0, rank=0)]
    second = scalars.take(reports(1, {"t": 11.0, "step": 1, "metrics": {"loss": 2.0}}), now=0.1)
    assert second == [Point("loss", 1, 2.0, 11.0, rank=1), Point("loss", 1, 1.5, 11.0)]
    assert scalars.rest() == []


def test_a_metric_only_some_ranks_report_gets_its_mean_after_the_grace_or_at_the_end():
    scalars = Scalars(ranks=2)
    scalars.take(reports(0, {"t": 1.0, "step": 5, "metrics": {"acc": 0.5}}), now=0.0)
    assert scalars.take(reports(1, {"t": 2.0, "step": 5}), now=GRACE_SECONDS - 1) == []
    late = scalars.take(Message(Exit(0), 1), now=GRACE_SECONDS)
    assert late == [Point("acc", 5, 0.5, 1.0)]
    scalars.take(reports(0, {"t": 3.0, "step": 6, "metrics": {"acc": 0.75}}), now=GRACE_SECONDS + 1)
    assert scalars.rest() == [Point("acc", 6, 0.75, 3.0)]
    assert scalars.rest() == []


def test_a_value_after_its_steps_mean_was_written_is_the_ranks_point_only():
    scalars = Scalars(ranks=2)
    scalars.take(reports(0, {"t": 1.0, "step": 1, "metrics": {"loss": 1.0}}), now=0.0)
    assert scalars.take(Message(Exit(0), 0), now=GRACE_SECONDS) == [Point("loss", 1, 1.0, 1.0)]
    late = scalars.take(reports(1, {"t": 20.0, "step": 1, "metrics": {"loss": 3.0}}), now=GRACE_SECONDS + 1)
    assert late == [Point("loss", 1, 3.0, 20.0, rank=1)]
    assert scalars.rest() == []  # no second mean for step 1
    # Steps that come again (an estimator counts them per epoch) get their means again.
    again = [reports(rank, {"t": 30.0, "step": 1, "metrics": {"loss": 5.0}}) for rank in (0, 1)]
    assert scalars.take(again[0], now=20.0) + scalars.take(again[1], now=20.0) == [
        Point("loss", 1, 5.0, 30.0, rank=0),
        Point("loss", 1, 5.0, 30.0, rank=1),
        Point("loss", 1, 5.0, 30.0),
    ]


def started(rank: int, size: int) -> Message:
    return Message(Started("host", 100 + rank, rank, size), rank)


def test_an_attempt_on_fewer_ranks_gets_its_means_at_once_and_the_last_attempts_steps_are_written_first():
    """min_np=: 4 ranks, then 2 (two were lost mid-step), then 4 again; a retry on the same size."""
    scalars = Scalars(ranks=4)
    assert [scalars.take(started(rank, 4), now=0.0) for rank in range(4)] == [[]] * 4
    for rank in range(3):  # rank 3 lost before it reported step 7
        scalars.take(reports(rank, {"t": 1.0, "step": 7, "metrics": {"loss": float(rank)}}), now=1.0)
    assert scalars.take(started(0, 2), now=2.0) == [Point("loss", 7, 1.0, 1.0)]  # over the three
    scalars.take(started(1, 2), now=2.0)
    scalars.take(reports(0, {"t": 3.0, "step": 26, "metrics": {"loss": 2.0}}), now=3.0)
    both = scalars.take(reports(1, {"t": 3.5, "step": 26, "metrics": {"loss": 4.0}}), now=3.5)
    assert both[-1] == Point("loss", 26, 3.0, 3.5)  # at once: not after the grace, nor at the end
    assert [scalars.take(started(rank, 4), now=4.0) for rank in range(4)] == [[]] * 4
    for rank in range(4):
        points = scalars.take(reports(rank, {"t": 5.0, "step": 21, "metrics": {"loss": 1.0}}), now=5.0)
    assert points[-1] == Point("loss", 21, 1.0, 5.0)
    scalars.take(reports(0, {"t": 6.0, "step": 28, "metrics": {"loss": 8.0}}), now=6.0)
    assert scalars.take(started(0, 4), now=7.0) == [Point("loss", 28, 8.0, 6.0)]  # a retry, same size
    assert scalars.rest() == []


def test_a_retry_that_resumes_below_a_step_written_without_a_rank_means_it_over_every_rank_again():
    """Attempt 1 wrote step 80's mean without rank 1 (it died); attempt 2 resumed from step 50,
    and its rank 1's step 80 was taken as late, left out of the mean."""
    scalars = Scalars(ranks=2)
    for rank in (0, 1):
        scalars.take(started(rank, 2), now=0.0)
    scalars.take(reports(0, {"t": 1.0, "step": 80, "metrics": {"loss": 1.0}}), now=1.0)
    assert scalars.take(Message(Exit(1), 0), now=1.0 + GRACE_SECONDS)[-1] == Point("loss", 80, 1.0, 1.0)
    for rank in (0, 1):  # the retry
        scalars.take(started(rank, 2), now=50.0)
    scalars.take(reports(0, {"t": 60.0, "step": 80, "metrics": {"loss": 2.0}}), now=60.0)
    both = scalars.take(reports(1, {"t": 61.0, "step": 80, "metrics": {"loss": 4.0}}), now=61.0)
    assert both == [Point("loss", 80, 4.0, 61.0, rank=1), Point("loss", 80, 3.0, 61.0)]


def test_a_metric_without_a_step_is_at_the_ranks_current_step_else_its_count_of_records():
    scalars = Scalars(ranks=1)
    points = scalars.take(
        reports(
            0,
            {"t": 1.0, "metrics": {"a": 1.0}},  # no step yet: its first record
            {"t": 1.0, "metrics": {"a": 2.0}},  # its second
            {"t": 2.0, "step": 7, "total": 9},
            {"t": 3.0, "epoch": 0, "metrics": {"val_loss": 0.5}},  # at step 7, as in the live view
        ),
        now=0.0,
    )
    assert [(p.name, p.step, p.value) for p in points if p.rank is None] == [
        ("a", 1, 1.0),
        ("a", 2, 2.0),
        ("val_loss", 7, 0.5),
    ]


def test_messages_other_than_reports_and_unknown_ranks_give_nothing():
    scalars = Scalars(ranks=2)
    assert scalars.take(Message(Exit(0), 0), now=0.0) == []
    assert scalars.take(reports(5, {"t": 1.0, "step": 1, "metrics": {"loss": 1.0}}), now=0.0) == []
    assert scalars.rest() == []


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.lists(st.floats(min_value=-3600, max_value=-10), min_size=2, max_size=20))
def test_run_names_sort_in_the_order_the_runs_started_whatever_the_clock_says(offsets):
    """Two cells in one second (their TensorBoard folders sorted at random once), a clock that
    repeats or goes back: the names a process gives sort as it gave them, and differ."""
    now = time.time()
    names = [run_name(now + offset) for offset in sorted(offsets)]  # runs started in this order
    assert sorted(names) == names and len(set(names)) == len(names)
    later = [run_name(now + offset) for offset in offsets]  # the clock jumping back and forth
    assert sorted(later) == later and later[0] > names[-1]


class Kept:
    """A sink of our own interface that keeps what it is given; ``broken``: its messages raise."""

    def __init__(self, broken: bool = False) -> None:
        self.broken, self.messages, self.closed = broken, 0, []
        self.closing_thread: threading.Thread | None = None

    def message(self, message: Message) -> None:
        if self.broken:
            raise OSError("the tracking server went away")
        self.messages += 1

    def close(self, outcome: BaseException | None) -> None:
        self.closed.append(outcome)
        self.closing_thread = threading.current_thread()


def test_a_sink_that_fails_mid_run_is_closed_as_it_is_dropped_and_the_others_go_on(capsys):
    """It was dropped unclosed: an MLflow run it began stayed RUNNING, the notebook's active run.
    It is closed on the thread that fed it: MLflow's active run is that thread's."""
    from hvd_magic.sinks import Sinks

    broken, healthy = Kept(broken=True), Kept()
    sinks = Sinks({"MLflow": broken, "TensorBoard": healthy})
    for _ in range(3):
        sinks.message(reports(0, {"step": 1}))
    assert broken.closing_thread is threading.current_thread()
    sinks.close(None)
    assert [type(e).__name__ for e in broken.closed] == ["OSError"] and healthy.closed == [None]
    assert healthy.messages == 3
    assert "MLflow stopped during the run (OSError: the tracking server went away)" in capsys.readouterr().err
