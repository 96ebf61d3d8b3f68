"""The live view's logic: events in, state and widget messages out (no browser, no kernel)."""

from __future__ import annotations

import json
import re

import pytest
from ipywidgets.widgets.tests.utils import setup_test_comm, teardown_test_comm

from hvd_magic.protocol import Exit, Log, Message, RankError, Reports, Stall, Started
from hvd_magic.widgets.render import final_html, grid_html
from hvd_magic.widgets.state import MAX_POINTS, RunModel
from hvd_magic.widgets.terminal_log import MAX_LINE, TerminalLog


@pytest.fixture
def comms():
    setup_test_comm()
    yield
    teardown_test_comm()


def reports(rank: int, *records: dict, dropped: int = 0) -> Message:
    return Message(Reports(dropped), rank, json.dumps(list(records)).encode())


def log(rank: int, text: str | bytes) -> Message:
    return Message(Log("stdout"), rank, text.encode() if isinstance(text, str) else text)


def test_carriage_returns_rewrite_the_line_like_a_terminal():
    terminal = TerminalLog()
    terminal.feed("Epoch 1/2\n  1/10 [>.....] - loss: 0.9\r")
    terminal.feed("  5/10 [==>...] - loss: 0.5\r 10/10 [======] - loss: 0.1")
    terminal.feed("\n\x1b[32mdone\x1b[0m\n")
    assert terminal.lines == ["Epoch 1/2", " 10/10 [======] - loss: 0.1", "done"]


def test_a_shorter_rewrite_keeps_the_rest_of_the_line_as_a_terminal_does():
    terminal = TerminalLog()
    terminal.feed("100%|#####|\r 50%\n")
    assert terminal.lines == [" 50%|#####|"]


def test_log_keeps_the_newest_lines():
    terminal = TerminalLog(limit=3)
    terminal.feed("".join(f"{i}\n" for i in range(10)))
    assert terminal.lines == ["7", "8", "9"] and terminal.committed == 10


def test_a_line_never_ended_keeps_its_last_characters():
    """Progress dots with no newline grew one string for ever, copied at every feed."""
    terminal = TerminalLog()
    for _ in range(300):
        terminal.feed("." * 99 + "|")
    assert len(terminal.current) == MAX_LINE and terminal.current.endswith(".|")
    terminal.feed("\rX\n")  # a rewind still writes at the line's start
    assert (
        terminal.lines == ["X" + "." * 98 + "|" + terminal.lines[0][100:]]
        and len(terminal.lines[0]) == MAX_LINE
    )


def test_a_retried_attempt_shows_its_ranks_running_again_and_a_run_over_none_running():
    """A rank failed in attempt 1 (Horovod shut down under it) runs again in attempt 2; at the
    run's end, one that never said its exit (stopped with the run) is no longer "running"."""
    model = RunModel(2)
    for rank in (0, 1):
        model.apply(Message(Started("h", 1, rank, 2), rank))
    model.apply(Message(RankError("h", "HorovodInternalError", "shut down"), 0))
    model.apply(Message(Exit(1), 0))
    assert [p.state for p in model.progress] == ["failed", "running"]
    for rank in (0, 1):  # the retry
        model.apply(Message(Started("h", 2, rank, 2), rank))
    assert [p.state for p in model.progress] == ["running", "running"]
    model.apply(Message(Exit(0), 0))
    model.end()
    assert [p.state for p in model.progress] == ["done", "ended"]
    assert "1 ended" in model.summary() and "running" not in model.summary()


def test_steps_per_second_and_eta_decay_while_a_rank_reports_nothing():
    model = RunModel(1)
    model.apply(Message(Started("h0", 1, 0, 1), 0))
    model.apply(reports(0, {"t": 0.0, "step": 1, "total": 100}))
    model.apply(reports(0, {"t": 0.5, "step": 11, "total": 100}))  # 20 steps/s
    rank = model.progress[0]
    seen = rank.step_seen
    assert rank.rate_at(seen) == 20.0 and rank.eta_at(seen) == pytest.approx(89 / 20)
    assert rank.rate_at(seen + 0.4) == 20.0  # within one report's time (10 steps): as measured
    assert rank.rate_at(seen + 10) == pytest.approx(1.0)  # 10 s without a step: at most 10 in 10 s
    assert rank.eta_at(seen + 10) == pytest.approx(89.0)
    model.apply(reports(0, {"t": 10.5, "step": 12, "total": 100}))
    assert rank.rate_at(rank.step_seen) < 20.0  # it moved again; its smoothed rate fell
    model.apply(Message(Exit(0), 0))
    assert rank.eta_at(seen + 100) is None  # done: no ETA


def test_a_rank_that_reports_every_100_steps_shows_its_rate_between_reports():
    """It showed one step in the time since its report: 2 steps/s half a second after a report
    of a rank at 50 steps/s (an ETA 25 times too long)."""
    model = RunModel(1)
    for report, t in enumerate((0.0, 2.0, 4.0)):
        model.apply(reports(0, {"t": t, "step": 100 * report, "total": 100_000}))
    rank = model.progress[0]
    for quiet in (0.5, 1.0, 1.9):
        assert rank.rate_at(rank.step_seen + quiet) == 50.0
        assert rank.eta_at(rank.step_seen + quiet) == pytest.approx((100_000 - 200) / 50)
    assert rank.rate_at(rank.step_seen + 20) == pytest.approx(5.0)  # no report in 10 of its spans: decays


def test_the_grid_shows_each_ranks_resources_and_after_the_run_its_peak_memory():
    from hvd_magic.protocol import RankStatus
    from hvd_magic.widgets.render import grid_html

    model = RunModel(2)
    for rank in (0, 1):
        model.apply(Message(Started(f"h{rank}", 1, rank, 2), rank))
    model.apply(Message(RankStatus(rss=900 * 2**20, cpu=97.0), 0))
    model.apply(Message(RankStatus(rss=300 * 2**20, cpu=12.0, gpu=88.0, gpu_memory=3 * 2**30,
                                   gpu_memory_total=16 * 2**30, gpu_temperature=70.0), 1))  # fmt: skip
    model.apply(Message(RankStatus(rss=400 * 2**20, cpu=5.0), 0))
    grid = grid_html(model)
    assert "400 MB" in grid and "5 %" in grid and "88 %, 3.0/16 GB, 70 °C" in grid
    model.apply(Message(Exit(0), 0))
    assert "peak 900 MB" in grid_html(model)


def test_a_rank_runs_once_it_has_started_even_before_it_reports():
    model = RunModel(2)
    model.apply(Message(Started("h1", 2, 1, 2), 1))
    assert [p.state for p in model.progress] == ["starting", "running"]
    assert model.counts()["running"] == 1 and model.progress[1].fraction is None  # no progress yet


def test_model_follows_progress_metrics_and_states():
    model = RunModel(2)
    model.apply(Message(Started("h0", 1, 0, 2), 0))
    model.apply(reports(0, {"t": 0.0, "step": 1, "total": 4, "epoch": 0, "metrics": {"loss": 2.0}}))
    model.apply(reports(0, {"t": 1.0, "step": 3, "total": 4, "metrics": {"loss": 1.0}}))
    model.apply(reports(1, {"t": 1.0, "step": 3, "total": 4, "metrics": {"loss": 3.0}}, dropped=5))
    zero, one = model.progress
    assert (zero.host, zero.state, zero.step, zero.fraction, zero.rate) == ("h0", "running", 3, 0.75, 2.0)
    assert zero.eta_at(zero.step_seen) == pytest.approx(0.5)
    assert model.series["loss"][0].values == [2.0, 1.0]
    mean = model.mean_series("loss")
    assert (mean.steps, mean.values) == ([1.0, 3.0], [2.0, 2.0])
    model.apply(Message(Exit(0), 0))
    model.apply(Message(RankError(exc_type="ValueError"), 1))
    assert (zero.state, one.state, zero.fraction) == ("done", "failed", 1.0)
    assert "1 failed" in model.summary() and "5 reports dropped" in model.summary()


def test_series_are_thinned_but_keep_the_newest_point():
    model = RunModel(1)
    for step in range(1, 3 * MAX_POINTS):
        model.apply(reports(0, {"step": step, "metrics": {"loss": float(step)}}))
    series = model.series["loss"][0]
    assert len(series.steps) <= MAX_POINTS + 1 and series.steps[-1] == 3 * MAX_POINTS - 1


def test_all_log_tags_complete_lines_with_their_rank():
    model = RunModel(2)
    model.apply(log(1, "partial "))
    model.apply(log(0, "zero\n"))
    model.apply(log(1, "line\nnext"))
    assert model.all_log.lines == ["[0] zero", "[1] partial line"]


def test_a_character_split_across_two_log_messages_stays_whole():
    model = RunModel(2)
    text = "loss ↓ 0.5 ✓\n".encode()
    cut = text.index("↓".encode()) + 1  # inside the arrow's three bytes
    model.apply(log(0, text[:cut]))
    model.apply(log(1, b"other rank\n"))  # interleaved: each rank's stream decodes on its own
    model.apply(log(0, text[cut:]))
    assert model.logs[0].lines == ["loss ↓ 0.5 ✓"]
    assert "\ufffd" not in model.all_log.text()


def test_a_stalled_rank_is_marked_with_its_tensors_until_it_reports_again():
    model = RunModel(2)
    model.apply(Message(Started("h0", 1, 0, 2), 0))
    model.apply(Message(Stall([0], [["allreduce.t3"]], 15.0), 0))
    assert (model.progress[0].state, model.progress[0].stalled_on) == ("stalled", ["allreduce.t3"])
    assert "stalled: never submitted allreduce.t3" in grid_html(model)
    assert model.counts()["stalled"] == 1
    model.apply(reports(0, {"step": 5}))
    assert (model.progress[0].state, model.progress[0].stalled_on) == ("running", [])


def test_grid_turns_compact_for_many_ranks_and_still_shows_failed_and_slowest():
    model = RunModel(64)
    for rank in range(64):
        model.apply(reports(rank, {"step": 50 + rank % 50, "total": 100}))
    model.apply(Message(RankError(), 17))
    html = grid_html(model)
    assert "hvd-compact" in html and "64 ranks" in html
    rows = re.findall(r'data-rank="(\d+)"', html)
    assert rows[0] == "17" and "0" in rows and len(rows) == 6  # the failed rank, then the 5 slowest


def test_final_record_holds_the_curve_data():
    model = RunModel(2)
    for rank in (0, 1):
        model.apply(reports(rank, *({"step": s, "metrics": {"loss": 1.0 / (s + rank)}} for s in (1, 2, 3))))
    html = final_html(model)
    data = json.loads(re.search(r'class="hvd-metrics">(.*?)</script>', html).group(1))
    assert data["loss"]["rank 1"]["value"] == [0.5, 1 / 3, 0.25]
    assert data["loss"]["mean"]["step"] == [1.0, 2.0, 3.0]
    assert "<svg" in html


def test_a_loss_gone_to_nan_or_inf_breaks_the_saved_curve_there_and_its_data_stays_json():
    """The saved record's chart drew 'nan' into its points (a browser stops the line there, and a
    first nan made every point nan), inf flattened the scale, and its data held a bare NaN, which
    JSON.parse refuses."""
    model = RunModel(1)
    losses = [1.0, 0.5, float("nan"), 0.25, float("inf"), 0.125]
    model.apply(reports(0, *({"step": s, "metrics": {"loss": v}} for s, v in enumerate(losses))))
    html = final_html(model)
    payload = re.search(r'class="hvd-metrics">(.*?)</script>', html).group(1)
    data = json.loads(payload, parse_constant=lambda name: pytest.fail(f"{name} in the record's JSON"))
    assert data["loss"]["rank 0"]["value"] == [1.0, 0.5, None, 0.25, None, 0.125]
    points = re.findall(r'points="([^"]*)"><title>rank 0<', html)
    assert [len(p.split()) for p in points] == [2, 1, 1]  # the line broken at each
    assert "nan" not in html.lower().replace("nanoseconds", "") and "inf<" not in html
    assert ">1<" in html and ">0.125<" in html  # the scale of the finite values


def test_curves_catch_up_when_the_run_goes_quiet(comms):
    """Curves redraw at most twice a second; the last points must not wait for a next message."""
    from hvd_magic.widgets.live_view import LiveView

    now = [0.0]
    view = LiveView(1, show=False, clock=lambda: now[0])
    view.message(reports(0, {"step": 1, "metrics": {"loss": 1.0}}))
    view.tick()
    now[0] = 0.2
    view.message(reports(0, {"step": 2, "metrics": {"loss": 0.5}}))
    view.tick()  # the grid is redrawn, the curves wait (0.2 s after the last curve draw)
    for tick in range(1, 21):  # then nothing arrives for two seconds (e.g. a rank waits)
        now[0] = 0.2 + tick / 10
        view.tick()
    assert view.figure.data and {tuple(trace.x) for trace in view.figure.data} == {(1.0, 2.0)}


def test_live_view_sends_batched_throttled_updates(comms):
    from hvd_magic.widgets.live_view import LiveView

    now = [0.0]
    view = LiveView(2, show=False, clock=lambda: now[0])
    for i in range(1000):  # 1000 events over one simulated second, a tick after each
        now[0] = i / 1000
        view.message(reports(i % 2, {"step": i // 2 + 1, "total": 500, "metrics": {"loss": 1.0}}))
        view.tick()
    assert 1 <= view.updates <= 11
    view.message(Message(Exit(0), 0))
    view.message(Message(Exit(0), 1))
    view.draw(final=True)
    values = [
        kwargs["data"]["state"]["value"] for _, kwargs in view.grid.comm.messages if "value" in str(kwargs)
    ]
    assert values[-1].count('data-progress="100"') == 2  # both bars at 100 %, as sent to the browser
    assert view.metric.value == "loss" and len(view.figure.data) == 3  # two ranks and the mean


def test_closing_the_live_view_closes_every_widget_it_opened(comms):
    """Closed widgets leave the kernel and the saved notebook's widget state: the box's children,
    the plotly figure (5 MB of script in its state) and each one's layout and style too."""
    from ipywidgets import Widget

    from hvd_magic.widgets.live_view import LiveView

    view = LiveView(2, show=False)
    view.message(reports(0, {"step": 1, "metrics": {"loss": 1.0}}))
    view.tick()
    opened: dict[int, Widget] = {}
    pending: list[Widget] = [view.box]
    while pending:  # the tree as the browser knows it: every widget a synced trait refers to
        widget = pending.pop()
        if id(widget) not in opened:
            opened[id(widget)] = widget
            for name in widget.keys:
                value = getattr(widget, name)
                pending += [
                    v
                    for v in (value if isinstance(value, (list, tuple)) else [value])
                    if isinstance(v, Widget)
                ]
    expected = [view.figure, view.grid, view.summary, *view.log_panes, view.grid.layout, view.grid.style]
    assert {id(widget) for widget in expected} <= set(opened)
    assert all(widget.comm is not None for widget in opened.values())
    view.close()
    assert [widget for widget in opened.values() if widget.comm is not None] == []


def test_the_mean_and_band_over_ranks_are_taken_at_each_step_some_rank_reported():
    """Ranks report at steps of their own (one lags, one skips some, one sends a step twice):
    at each step, the mean, the lowest and the highest of the values there, as by hand."""
    import random

    chooser = random.Random(7)
    model, points = RunModel(4), {}
    for rank in range(4):
        for step in sorted(chooser.sample(range(1, 60), 40)) + ([30] if rank == 2 else []):
            value = chooser.uniform(-5, 5)
            model.apply(reports(rank, {"step": step, "metrics": {"loss": value}}))
            points.setdefault(float(step), []).append(value)
    mean = model.mean_series("loss")
    low, high = model.band_series("loss")
    assert mean.steps == low.steps == high.steps == sorted(points)
    assert mean.values == pytest.approx([sum(points[s]) / len(points[s]) for s in mean.steps])
    assert low.values == [min(points[s]) for s in low.steps]
    assert high.values == [max(points[s]) for s in high.steps]
    model.apply(reports(0, {"step": 99, "metrics": {"loss": 1.0}}))  # a change is seen at once
    assert model.mean_series("loss").steps[-1] == 99.0 and model.mean_series("nothing").steps == []
