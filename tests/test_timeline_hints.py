"""Stragglers and tuning hints: checked against a brute-force reading of built timelines (in
Horovod 0.28's shape), silent on a balanced one, and naming the rank a real run slows on purpose."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from hvd_magic.timeline import analyze, read
from hvd_magic.timeline.hints import duration

from .timeline_fixtures import write_events

SLOW_CELL = """
import time, horovod.torch as hvd, torch
hvd.init()
model = torch.nn.Linear(10, 10)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
for _ in range(15):
    if hvd.rank() == 1:
        time.sleep(0.05)                     # rank 1's input pipeline is slow
    optimizer.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
"""


def built_timeline(
    path: Path, lateness: dict[int, list[int]], step_us: int = 100_000, cached_after: int | None = None
) -> Path:
    """Two tensors, one negotiation each per step: rank r marks ready ``lateness[r][step]`` µs
    after the step begins; the allreduce follows the last mark. From step ``cached_after`` on,
    negotiations carry no marks, as Horovod writes those answered from its response cache."""
    events: list[dict] = []
    for pid, tensor in ((1, "allreduce.weight"), (2, "allreduce.bias")):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": tensor}})
    steps = len(next(iter(lateness.values())))
    for step in range(steps):
        for pid in (1, 2):
            begin = step * step_us + pid
            events.append({"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": begin, "pid": pid})
            marks = sorted((begin + late[step], rank) for rank, late in lateness.items())
            if cached_after is None or step < cached_after:
                events += [{"ph": "X", "name": str(r), "ts": ts, "pid": pid, "dur": 0} for ts, r in marks]
            end = marks[-1][0] + 1
            events.append({"ph": "E", "ts": end, "pid": pid})
            events.append({"ph": "B", "name": "ALLREDUCE", "ts": end, "pid": pid})
            events.append({"ph": "B", "name": "MPI_ALLREDUCE", "ts": end + 1, "pid": pid})
            events.append({"ph": "E", "ts": end + 400, "pid": pid})
            events.append({"ph": "E", "ts": end + 401, "pid": pid})
    return write_events(path, events)


def brute_force(lateness: dict[int, list[int]]) -> dict[str, tuple[int, float]]:
    """rank -> (times last, mean wait), computed negotiation by negotiation."""
    last: dict[str, list[int]] = {}
    for step in range(len(lateness[0])):
        for _ in (1, 2):  # two tensors, the same readiness
            ordered = sorted((late[step], rank) for rank, late in lateness.items())
            wait = ordered[-1][0] - ordered[-2][0]
            last.setdefault(str(ordered[-1][1]), []).append(wait)
    return {rank: (len(waits), sum(waits) / len(waits)) for rank, waits in last.items()}


def waits(lateness: dict[int, list[int]]) -> list[int]:
    """Each step's wait for its last rank."""
    found = []
    for step in range(len(lateness[0])):
        ordered = sorted(late[step] for late in lateness.values())
        found.append(ordered[-1] - ordered[-2])
    return found


def test_stragglers_match_a_brute_force_count(tmp_path):
    rng = random.Random(7)
    lateness = {rank: [rng.randrange(0, 20_000) for _ in range(30)] for rank in range(3)}
    analysis = analyze(read(built_timeline(tmp_path / "t.json", lateness)))
    expected = brute_force(lateness)
    frame = analysis.stragglers
    assert analysis.negotiations == analysis.ranked == 60
    found = {rank: (int(row["times last"]), round(row["mean wait"], 6)) for rank, row in frame.iterrows()}
    assert found == {rank: (count, round(mean, 6)) for rank, (count, mean) in expected.items()}
    assert frame["share"].sum() == pytest.approx(1.0)
    worst = analysis.worst
    assert len(worst) == 5 and list(worst["wait"]) == sorted(worst["wait"], reverse=True)
    assert worst["wait"].iloc[0] == max(waits(lateness))


def test_a_rank_late_most_of_the_time_is_named_with_its_evidence(tmp_path):
    steps = 20
    lateness = {0: [0] * steps, 1: [100] * steps, 2: [8_000 if s % 5 else 50 for s in range(steps)]}
    analysis = analyze(read(built_timeline(tmp_path / "t.json", lateness)))
    (hint,) = [h for h in analysis.hints if h.startswith("rank ")]
    assert hint.startswith("rank 2 was the last to be ready in 80% of 40 negotiations")
    assert "waited 7.9 ms for it each time on average (7.9 ms at most)" in hint
    assert "what to change" in analysis.to_html() and "rank 2 was the last" in analysis.to_html()


def test_a_balanced_timeline_gives_no_hint(tmp_path):
    rng = random.Random(3)
    lateness = {rank: [rng.randrange(0, 200) for _ in range(40)] for rank in range(2)}
    analysis = analyze(read(built_timeline(tmp_path / "t.json", lateness)))
    assert analysis.hints == []
    assert "no tuning hint" in analysis.to_html()


def test_negotiation_that_outweighs_the_data_movement_is_told(tmp_path):
    lateness = {
        0: [0] * 20,
        1: [5_000 if s % 2 else 0 for s in range(20)],
        2: [5_000 if s % 2 == 0 else 0 for s in range(20)],
    }
    analysis = analyze(read(built_timeline(tmp_path / "t.json", lateness)))
    assert not [h for h in analysis.hints if h.startswith("rank ")]  # late in turn: no one straggler
    (hint,) = analysis.hints
    assert hint.startswith("negotiation took") and "the ranks reach each step at different times" in hint


def test_durations_read_as_people_read_them():
    assert [duration(v) for v in (12, 12_345, 9_950_756)] == ["12 µs", "12.3 ms", "9.95 s"]


def test_waits_the_response_cache_hides_are_told_with_the_way_to_name_the_rank(tmp_path):
    lateness = {0: [0] * 20, 1: [8_000] * 20}
    analysis = analyze(read(built_timeline(tmp_path / "t.json", lateness, cached_after=1)))
    assert (analysis.negotiations, analysis.ranked) == (40, 2)
    assert not [h for h in analysis.hints if h.startswith("rank ")]  # 2 ranked negotiations: no pattern
    (cached,) = [h for h in analysis.hints if "response cache" in h]
    assert cached.startswith("38 of 40 negotiations") and "env=HOROVOD_CACHE_CAPACITY=0" in cached
    assert "2 of 40 negotiations name their ranks" in analysis.to_html()
    everything = analyze(read(built_timeline(tmp_path / "all.json", lateness)))
    assert not [h for h in everything.hints if "response cache" in h]


def test_a_real_run_names_the_rank_slowed_on_purpose(ip, tmp_path):
    """By default Horovod answers every step after the first from its response cache, which
    names no rank: the analysis says so and how to name it; run that way, it names rank 1."""
    cached = tmp_path / "cached.json"
    ip.run_cell_magic("horovod", f"np=-2 timeline={cached}", SLOW_CELL)
    analysis = analyze(read(cached))
    assert analysis.negotiations >= 30 and analysis.ranked < 10, (analysis.negotiations, analysis.ranked)
    assert [h for h in analysis.hints if "HOROVOD_CACHE_CAPACITY=0" in h], analysis.hints

    uncached = tmp_path / "uncached.json"
    ip.run_cell_magic("horovod", f"np=-2 timeline={uncached} env=HOROVOD_CACHE_CAPACITY=0", SLOW_CELL)
    analysis = analyze(read(uncached))
    assert analysis.ranked >= 30, analysis.ranked
    assert analysis.stragglers.index[0] == "1", analysis.stragglers
    assert analysis.stragglers.loc["1", "share"] >= 0.8
    hints = [h for h in analysis.hints if h.startswith("rank 1 was the last to be ready")]
    assert hints, analysis.hints


def test_phases_match_a_brute_force_sum(tmp_path):
    rng = random.Random(11)
    lateness = {rank: [rng.randrange(0, 20_000) for _ in range(25)] for rank in range(2)}
    phases = analyze(read(built_timeline(tmp_path / "t.json", lateness))).per_phase
    negotiation = [max(late[s] for late in lateness.values()) + 1 for s in range(25) for _ in (1, 2)]
    assert phases.loc["negotiation", "total"] == sum(negotiation)
    assert phases.loc["negotiation", "count"] == 50
    assert phases.loc["negotiation", "p50"] == statistics.median(negotiation)
    assert phases.loc["collective", "total"] == 399 * 50  # MPI_ALLREDUCE, inside each ALLREDUCE
    fifths = phases.loc["collective", ["0-20%", "20-40%", "40-60%", "60-80%", "80-100%"]]
    assert fifths.sum() == pytest.approx(1.0) and all(f == pytest.approx(0.2) for f in fifths)  # steady


def with_cycles(path: Path, every_us: int, count: int) -> Path:
    """The timeline at ``path`` with Horovod's cycle marks (timeline=cycles) added."""
    events = json.loads(path.read_text())
    events += [{"name": "CYCLE_START", "ph": "i", "ts": n * every_us, "s": "g"} for n in range(count)]
    return write_events(path, events)


def test_mostly_idle_cycles_are_told_and_busy_ones_are_not(tmp_path):
    steps = 20  # a step every 100 ms: 2 tensors each, negotiated and reduced in the step's first ms
    lateness = {0: [0] * steps, 1: [100] * steps}
    idle = analyze(read(with_cycles(built_timeline(tmp_path / "idle.json", lateness), 1_000, 2_000)))
    assert idle.cycles == 2_000 and idle.idle_cycles == 2_000 - steps  # one cycle per step starts the two
    (hint,) = idle.hints
    assert hint.startswith("99% of 2000 cycles started no operation (a cycle every 1.0 ms)")
    busy = analyze(read(with_cycles(built_timeline(tmp_path / "busy.json", lateness), 100_000, steps)))
    assert busy.cycles == steps and busy.idle_cycles == 0 and busy.hints == []
