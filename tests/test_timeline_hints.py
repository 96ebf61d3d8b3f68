"""Stragglers and tuning hints: checked against a brute-force reading of built timelines (in
Horovod 0.28's shape), silent on a balanced one, and naming the rank a real run slows on purpose."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from hvd_magic.timeline import analyze, read
from hvd_magic.timeline.hints import duration
from hvd_magic.timeline.reader import read_fast, read_general

from .timeline_fixtures import write_events

SLOW_CELL = """
import time, horovod.torch as hvd, torch
hvd.init()
model = torch.nn.Linear(10, 10)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
for _ in range(15):
    if hvd.rank() == 1:
        time.sleep(0.15)                     # rank 1's input is slow (by far, on a loaded machine too)
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


def test_given_the_runs_hosts_the_analysis_names_each_ranks_host(tmp_path):
    steps = 20
    lateness = {0: [0] * steps, 1: [100] * steps, 2: [8_000 if s % 5 else 50 for s in range(steps)]}
    hosts = {0: "hostA", 1: "hostB", 2: "hostC"}
    analysis = analyze(read(built_timeline(tmp_path / "t.json", lateness)), hosts=hosts)
    (hint,) = [h for h in analysis.hints if h.startswith("rank ")]
    assert hint.startswith("rank 2 on hostC was the last to be ready in 80% of 40 negotiations"), hint
    assert {rank: analysis.stragglers.loc[rank, "host"] for rank in "012"} == {
        "0": "hostA",
        "1": "hostB",
        "2": "hostC",
    }
    assert set(analysis.worst["host"]) == {"hostC"} and "<th>host</th>" in analysis.to_html()
    partial = analyze(read(built_timeline(tmp_path / "t.json", lateness)), hosts={0: "hostA"})
    assert [h for h in partial.hints if h.startswith("rank 2 was the last")]  # no host known: none said


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
    # the sizes Horovod wrote (weight 10x10, bias 10, float32) and its collectives of one or both
    store = read(uncached).store
    sizes = dict(zip(store.row_tensors, store.row_bytes.tolist(), strict=True))
    assert sizes == {"allreduce.weight": 400, "allreduce.bias": 40}
    fusion = analysis.fusion.loc["ALLREDUCE"]
    assert 15 <= fusion["collectives"] <= 30 and fusion["distinct"] == 2
    assert fusion["collectives"] * fusion["tensors"] == pytest.approx(30)  # 15 steps, 2 tensors each
    assert fusion["bytes max"] <= 440


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


DTYPES = {"float32": 4, "HOROVOD_FLOAT64": 8, "float16": 2, "bool": 1, "HOROVOD_UINT8": 1, "int64": 8}


def fused_timeline(
    path: Path, steps: int, sizes: dict[int, tuple[str, str]], rng: random.Random, fused: range = range(1, 4)
) -> list[list[int]]:
    """Each step, the tensors in a random order split into collectives of ``fused`` tensors,
    one after the other (Horovod's shape: every tensor of a collective starts its ALLREDUCE before any ends;
    the end carries the tensor's dtype and shape). Returns the collectives as lists of pids."""
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"allreduce.t{pid}"}}
        for pid in sizes
    ]
    collectives, ts = [], 0
    for _ in range(steps):
        pending = rng.sample(list(sizes), len(sizes))
        while pending:
            take = min(rng.choice(fused), len(pending))
            group, pending = pending[:take], pending[take:]
            collectives.append(group)
            for pid in group:
                ts += rng.randint(0, 2)
                events.append({"ph": "B", "name": "ALLREDUCE", "ts": ts, "pid": pid})
            for pid in group:
                events.append({"ph": "B", "name": "MPI_ALLREDUCE", "ts": ts + 1, "pid": pid})
            ts += rng.randint(20, 200)
            for pid in group:
                events.append({"ph": "E", "ts": ts, "pid": pid})
            for pid in group:
                ts += rng.randint(0, 2)
                dtype, shape = sizes[pid]
                events.append({"ph": "E", "ts": ts, "pid": pid, "args": {"dtype": dtype, "shape": shape}})
            ts += rng.randint(1, 50)
    write_events(path, events)
    return collectives


def element_bytes(dtype: str, shape: str) -> int:
    return DTYPES[dtype] * math.prod(int(d) for d in shape.strip("[]").split(",") if d.strip())


def test_tensor_sizes_are_read_from_the_operations_ends_by_both_readers(tmp_path):
    sizes = {1: ("float32", "[3, 10]"), 2: ("HOROVOD_FLOAT64", "[]"), 3: ("bool", "[7]"),
             4: ("HOROVOD_UINT8", "[2,2, 2]"), 5: ("complex", "[4]"), 6: ("float32", "[3, ]")}  # fmt: skip
    path = tmp_path / "t.json"
    fused_timeline(path, 2, sizes, random.Random(1))
    expected = {pid: element_bytes(*sizes[pid]) for pid in (1, 2, 3, 4)}  # 5, 6: no size to read
    assert expected == {1: 120, 2: 8, 3: 7, 4: 8}
    assert read_fast(str(path)).tensor_bytes == read_general(str(path)).tensor_bytes == expected
    store = read(path).store
    assert dict(zip(store.row_pids.tolist(), store.row_bytes.tolist(), strict=True)) == {
        **expected,
        5: 0,
        6: 0,
    }


def test_fusion_matches_the_collectives_the_timeline_was_built_with(tmp_path):
    rng = random.Random(5)
    shapes = {
        pid: (rng.choice(list(DTYPES)), f"[{rng.randint(1, 64)}, {rng.randint(1, 64)}]")
        for pid in range(1, 9)
    }
    collectives = fused_timeline(tmp_path / "t.json", 30, shapes, rng)
    threshold = 20_000
    fusion = analyze(read(tmp_path / "t.json"), threshold).fusion.loc["ALLREDUCE"]
    payloads = [sum(element_bytes(*shapes[pid]) for pid in group) for group in collectives]
    assert fusion["collectives"] == len(collectives)
    assert fusion["tensors"] == pytest.approx(statistics.mean(len(g) for g in collectives))
    assert fusion["most tensors"] == 3 and fusion["distinct"] == 8
    assert fusion["alone"] == pytest.approx(sum(len(g) == 1 for g in collectives) / len(collectives))
    assert fusion["bytes p50"] == statistics.median(payloads) and fusion["bytes max"] == max(payloads)
    assert fusion["full"] == pytest.approx(sum(p >= 0.8 * threshold for p in payloads) / len(payloads))


def test_a_full_fusion_buffer_and_tensors_that_go_alone_are_told(tmp_path):
    shapes = {pid: ("float32", "[100]") for pid in range(1, 5)}  # 400 bytes each
    fused = tmp_path / "fused.json"
    fused_timeline(fused, 20, shapes, random.Random(2), fused=range(2, 3))
    full = [h for h in analyze(read(fused), 1_000).hints if "HOROVOD_FUSION_THRESHOLD" in h]
    assert full and "filled the fusion buffer to 80% or more" in full[0], full
    assert "env=HOROVOD_FUSION_THRESHOLD=2000" in full[0]
    assert analyze(read(fused), 64 << 20).hints == []  # the default buffer has room to spare
    alone = tmp_path / "alone.json"
    fused_timeline(alone, 10, shapes, random.Random(2), fused=range(1, 2))
    (hint,) = analyze(read(alone), 64 << 20).hints
    assert hint.startswith("100% of 40 ALLREDUCE collectives carried a single tensor (median 400 B)")
    assert "HOROVOD_CYCLE_TIME" in hint
    assert analyze(read(alone), 0).hints == []  # HOROVOD_FUSION_THRESHOLD=0: fusion off on purpose
    assert "tensors per collective" in analyze(read(alone), 0).to_html()
