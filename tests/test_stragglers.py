"""Straggler detection as pure code, on a fake clock: the rule's spelling, the detector's
promises (property-style), the likely reasons, the watch fed with messages, and what the views
make of a ``Straggler``."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_magic.options import OptionError, make_options
from hvd_magic.options.straggler_rule import StragglerRule, parse_rule
from hvd_magic.protocol import Exit, Message, RankStatus, Reports, Started, Straggler, TimingOff
from hvd_magic.run.stragglers import (
    CHECK_SECONDS,
    RECOVERY_SHARE,
    StragglerDetector,
    StragglerWatch,
    likely_reason,
)
from hvd_magic.run.views import ConsoleView
from hvd_magic.widgets.render import grid_html
from hvd_magic.widgets.state import RunModel

RULE = StragglerRule(0.7, 10.0)


@pytest.mark.parametrize(
    ("given_value", "rule"),
    [
        (None, StragglerRule(0.7, 10.0)),
        ("0.7/10", StragglerRule(0.7, 10.0)),
        ("70%/10s", StragglerRule(0.7, 10.0)),
        ("0.5/2.5", StragglerRule(0.5, 2.5)),
        ("0.6", StragglerRule(0.6, 10.0)),
        ("on", StragglerRule()),
        ("off", None),
        (False, None),
    ],
)
def test_the_rule_is_spelled_fraction_slash_seconds(given_value, rule):
    assert parse_rule(given_value) == rule


@pytest.mark.parametrize("bad", ["1.5/10", "0/10", "0.7/-1", "fast", "0.7/ten", "70/10"])
def test_a_bad_rule_is_a_clear_option_error(bad):
    with pytest.raises(OptionError, match=r"stragglers takes FRACTION/SECONDS.*0\.7/10"):
        make_options(np=-2, stragglers=bad)


def test_the_default_watches_at_70_percent_for_10_seconds():
    assert make_options(np=-2).stragglers == StragglerRule(0.7, 10.0)
    assert make_options(np=-2, stragglers="off").stragglers is None


def test_a_slow_rank_is_named_once_and_cleared_when_it_recovers():
    detector = StragglerDetector(RULE)
    changes = []
    for tick in range(100):  # 0.5 s apart: slow for 25 s, then as fast as the others
        now = tick * 0.5
        rate = 0.4 if now < 25 else 1.0
        changes += [(now, c.rank, c.named) for c in detector.check(now, {0: 1.0, 1: rate, 2: 1.1})]
    assert changes == [(10.0, 1, True), (25 + RECOVERY_SHARE * 10, 1, False)]


def test_no_median_without_two_ranks_and_a_finished_rank_is_forgotten():
    detector = StragglerDetector(StragglerRule(0.7, 1.0))
    assert detector.check(0, {1: 0.1}) == [] and detector.check(5, {1: 0.1}) == []
    detector.check(0, {0: 1.0, 1: 0.1})
    assert [c.rank for c in detector.check(2, {0: 1.0, 1: 0.1})] == [1]
    assert detector.check(3, {0: 1.0}) == [] and detector.named == set()


rates = st.floats(min_value=0.01, max_value=50, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.05, 3.0), st.lists(rates, min_size=2, max_size=5)), max_size=60),
    st.sampled_from([StragglerRule(0.7, 10), StragglerRule(0.5, 2), StragglerRule(0.9, 0.5)]),
)
def test_named_after_a_whole_window_below_and_cleared_after_half_one_above(steps, rule):
    """Whatever the rates: a rank is named at the first check that ends ``seconds`` of checks
    all below the fraction of the median, cleared at the first that ends half that all at or
    above; its changes alternate, a name first."""
    detector = StragglerDetector(rule)
    ranks = max((len(r) for _, r in steps), default=2)
    history: list[tuple[float, dict[int, bool]]] = []
    said: dict[int, list[bool]] = {}
    now = 0.0
    for gap, values in steps:
        now += gap
        given_rates = {rank: values[rank % len(values)] for rank in range(ranks)}
        median = statistics.median(given_rates.values())
        history.append((now, {r: v < rule.fraction * median for r, v in given_rates.items()}))
        for change in detector.check(now, given_rates):
            said.setdefault(change.rank, []).append(change.named)
            since = now  # the start of the rank's streak of checks on the side it is judged
            for at, slow in reversed(history):
                if slow[change.rank] != change.named:
                    break
                since = at
            window = rule.seconds if change.named else RECOVERY_SHARE * rule.seconds
            assert now - since >= window  # the whole window on that side
            assert all(at - since < window for at, _ in history[:-1] if at >= since)  # not later
    for changes in said.values():
        assert changes == [index % 2 == 0 for index in range(len(changes))]


@settings(max_examples=100, deadline=None)
@given(st.lists(rates, min_size=2, max_size=6).map(lambda r: [r[0]] * len(r)), st.integers(1, 200))
def test_ranks_at_one_rate_are_never_named(same, checks):
    detector = StragglerDetector(StragglerRule(0.7, 1.0))
    for tick in range(checks):
        assert detector.check(tick * 0.1, dict(enumerate(same))) == []


def status(**figures: float) -> RankStatus:
    return RankStatus(**{"rss": 2**30, "cpu": 5.0, "cores": 2, "host_cpu": 20.0, **figures})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("figures", "swap_rate", "reason"),
    [
        ({}, 8 * 2**20, "memory swapping: its host swaps 8.0 MB/s"),
        ({"host_cpu": 98.0}, 0.0, "CPU saturated: its host's CPUs 98 % busy"),
        ({"cpu": 195.0}, None, "CPU saturated: its host's CPUs 20 % busy, the rank at 195 % of one core"),
        ({"gpu": 99.0, "gpu_temperature": 83.0}, None, "GPU busy: 99 % utilised (83 °C)"),
        (
            {"gpu": 2.0},
            None,
            "data wait: between steps it neither computes (CPU 5 % of one core, its GPU idle (2 %))",
        ),
        ({}, 1000.0, "data wait:"),
    ],
)
def test_the_likely_reason_comes_from_what_is_measured(figures, swap_rate, reason):
    assert likely_reason(status(**figures), swap_rate).startswith(reason)


def test_a_data_wait_says_an_idle_gpu_and_no_figures_say_so():
    assert "its GPU idle (2 %)" in likely_reason(status(gpu=2.0))
    assert likely_reason(None).startswith("unknown")


def reports(*steps: tuple[int, float]) -> bytes:
    return json.dumps([{"t": t, "step": step} for step, t in steps]).encode()


def test_the_watch_names_a_rank_with_its_host_and_reason_from_the_messages_it_is_fed():
    watch = StragglerWatch(StragglerRule(0.7, 2.0))
    for rank in (0, 1):
        watch.take(Message(Started(f"host-{rank}", 100 + rank, rank, 2), rank), 0.0)
    watch.take(Message(RankStatus(cpu=3.0, cores=2, host_cpu=30.0, swapped=0), 1), 0.5)
    watch.take(Message(RankStatus(cpu=3.0, cores=2, host_cpu=30.0, swapped=0), 1), 1.5)
    found: list[tuple[float, Straggler]] = []
    for tick in range(1, 81):  # 10 checks a second; rank 0 steps 10 a second, rank 1 2 a second
        now = tick / 10
        watch.take(Message(Reports(), 0, reports((tick, 1000 + now))), now)
        if tick % 5 == 0:
            watch.take(Message(Reports(), 1, reports((tick // 5, 1000 + now))), now)
        found += [(now, straggler) for straggler in watch.check(now)]
    assert len(found) == 1
    at, straggler = found[0]
    assert (straggler.slow_rank, straggler.host, straggler.recovered) == (1, "host-1", False)
    assert straggler.rate == pytest.approx(2.0) and straggler.median == pytest.approx(6.0)
    assert straggler.reason.startswith("data wait") and 3.0 <= at <= 5.0
    watch.take(Message(Exit(0), 1), 8.1)
    assert watch.check(8.2) == []  # it finished: forgotten, not "caught up"


def test_the_watch_judges_at_most_twenty_times_a_second_however_often_it_is_asked():
    """A run's loop asks at every turn (a hundred times a second under a flood of reports): the
    rates are judged every CHECK_SECONDS, and the slow rank is still named once, in time."""
    watch = StragglerWatch(StragglerRule(0.7, 2.0))
    assert watch.detector is not None
    judged, judge = [], watch.detector.check
    watch.detector.check = lambda now, rates: judged.append(now) or judge(now, rates)  # type: ignore[method-assign]
    found = []
    for tick in range(1, 801):  # asked 100 times a second; rank 0 steps 10 a second, rank 1 2
        now = tick / 100
        if tick % 10 == 0:
            watch.take(Message(Reports(), 0, reports((tick // 10, 1000 + now))), now)
        if tick % 50 == 0:
            watch.take(Message(Reports(), 1, reports((tick // 50, 1000 + now))), now)
        found += [(now, straggler) for straggler in watch.check(now)]
    assert 8 / (CHECK_SECONDS + 0.01) - 2 <= len(judged) <= 8 / CHECK_SECONDS + 1  # not 800
    assert [(s.slow_rank, s.recovered) for _, s in found] == [(1, False)] and 3.0 <= found[0][0] <= 5.0


def lock_step(
    watch: StragglerWatch,
    waits: dict[int, float] | None,
    seconds: int = 8,
    unsent: Callable[[int, float], bool] = lambda rank, now: False,
) -> list[Straggler]:
    """Three ranks in lock-step, five steps a second on the wall clock; with ``waits``, each
    rank's seconds waited in collectives per step (sent as ``w``, unless ``unsent(rank, now)``)."""
    found = []
    for tick in range(1, seconds * 10 + 1):
        now = tick / 10
        if tick % 2 == 0:
            for rank in (0, 1, 2):
                record = {"t": 1000 + now, "step": tick // 2}
                if waits is not None and not unsent(rank, now):
                    record["w"] = waits[rank] * (tick // 2)
                watch.take(Message(Reports(), rank, json.dumps([record]).encode()), now)
        found += watch.check(now)
    return found


def test_in_lock_step_the_rank_the_others_wait_for_is_named_from_its_waits():
    # Each step takes 0.2 s for all; ranks 0 and 2 wait 0.15 s of it in the allreduce, rank 1
    # (slowed by its data) 0.01 s: its own work is 0.19 s a step against the others' 0.05 s.
    watch = StragglerWatch(StragglerRule(0.7, 2.0))
    watch.take(Message(RankStatus(cpu=4.0, cores=2, host_cpu=30.0, swapped=0), 1), 0.5)
    found = lock_step(watch, {0: 0.15, 1: 0.01, 2: 0.15})
    assert [(s.slow_rank, s.recovered) for s in found] == [(1, False)], found
    named = found[0]
    assert named.rate == pytest.approx(1 / 0.19, rel=0.05) and named.median == pytest.approx(20.0, rel=0.05)
    assert named.outside == pytest.approx(0.95, abs=0.02)
    assert named.reason.startswith("data wait: 95% of its time is outside collectives")
    assert "of its own work (outside collectives)" in named.text()


def test_in_lock_step_without_measured_waits_no_rank_stands_out():
    assert lock_step(StragglerWatch(StragglerRule(0.7, 2.0)), None) == []
    # measured, and even: nobody is named either
    assert lock_step(StragglerWatch(StragglerRule(0.7, 2.0)), {0: 0.1, 1: 0.1, 2: 0.1}) == []


def test_while_a_rank_sends_no_waits_every_rank_is_judged_by_wall_time():
    """A rank whose timing stopped (it cost too much) or is held (measuring what it costs) sends
    no waits: judging the others' own clocks against its wall clock would name it; all are
    judged by wall time then (nobody in lock-step), by their own clocks again once all send."""
    waits = {0: 0.15, 1: 0.01, 2: 0.15}  # rank 1 is the one the others wait for
    stopped = lock_step(
        StragglerWatch(StragglerRule(0.7, 2.0)), waits, unsent=lambda rank, now: rank == 0 and now > 1
    )
    assert stopped == []
    held = lock_step(StragglerWatch(StragglerRule(0.7, 2.0)), waits, 12, lambda rank, now: 1 < now <= 4)
    assert [(s.slow_rank, s.recovered) for s in held] == [(1, False)], held
    assert held[0].outside > 0.85  # on its own clock again (0.95 once its rate has settled)


def test_a_rank_that_goes_silent_decays_into_a_straggler():
    watch = StragglerWatch(StragglerRule(0.7, 2.0))
    for tick in range(1, 101):
        now = tick / 10
        watch.take(Message(Reports(), 0, reports((tick, now))), now)
        if now <= 3:
            watch.take(Message(Reports(), 1, reports((tick, now))), now)
        if named := watch.check(now):
            assert [s.slow_rank for s in named] == [1] and now >= 3 + 2
            return
    pytest.fail("a rank silent for 7 s was never named")


def test_off_watches_nothing():
    watch = StragglerWatch(None)
    watch.take(Message(Reports(), 0, b"not even json"), 0.0)
    assert watch.check(100.0) == []


NAMED = Straggler(1, "host-1", 0.4, 1.1, 0.7, 10.0, "data wait: between steps it neither computes")


def test_the_live_model_shows_a_straggler_until_it_recovers():
    model = RunModel(2)
    model.apply(Message(Started("host-1", 1, 1, 2), 1))
    model.apply(Message(NAMED, 1))
    assert "rank 1 (host-1) is a straggler: 0.40 steps/s" in model.summary()
    assert "likely data wait" in model.summary() and "straggler: data wait" in grid_html(model)
    model.apply(Message(Straggler(1, "host-1", 1.0, 1.1, 0.7, 10.0, recovered=True), 1))
    assert "straggler" not in model.summary() and "straggler" not in grid_html(model)


def test_a_timing_stopped_for_its_cost_is_said_once_whichever_ranks_say_it(capsys):
    view, model = ConsoleView(), RunModel(2)
    for rank in (1, 0):
        off = Message(TimingOff(0.0869, 0.00141, 0.01), rank)
        view.message(off)
        model.apply(off)
    said = (
        "hvd_magic: rank 1's wait timing cost 8.7 % of its 1.41 ms step (over 1 %); it is off for this "
        "run, and stragglers are judged by wall time"
    )
    assert capsys.readouterr().err.splitlines() == [said]
    assert model.summary().endswith(said) and model.summary().count("wait timing") == 1


def test_the_console_says_a_straggler_once_and_when_it_caught_up(capsys):
    view = ConsoleView()
    view.message(Message(NAMED, 1))
    view.message(Message(Straggler(1, "host-1", 1.0, 1.1, 0.7, 10.0, recovered=True), 1))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "hvd_magic: rank 1 (host-1) is a straggler: 0.40 steps/s, the ranks' median 1.10 (below 70% "
        "of the median for 10 s); likely data wait: between steps it neither computes",
        "hvd_magic: rank 1 (host-1) caught up: 1.00 steps/s, the ranks' median 1.10",
    ]
