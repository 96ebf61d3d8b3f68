"""Spans from B/E pairs (hvd_magic.timeline.matching, through Timeline.spans())."""

from __future__ import annotations

import json
from pathlib import Path

from hvd_magic.timeline import read, spans

from .timeline_fixtures import real_timelines, reference_spans, write_events

__all__ = ["real_timelines"]  # a fixture, used by name


def test_spans_pair_by_depth_per_tensor_and_drop_the_unmatched(tmp_path: Path) -> None:
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "bias"}},
        {"name": "ALLREDUCE", "ph": "B", "pid": 1, "ts": 10},
        {"name": "MEMCPY", "ph": "B", "pid": 2, "ts": 11},  # interleaved with tensor 1
        {"name": "NCCL", "ph": "B", "pid": 1, "ts": 12},
        {"ph": "E", "pid": 1, "ts": 15},
        {"ph": "E", "pid": 2, "ts": 16},
        {"ph": "E", "pid": 1, "ts": 20},
        {"ph": "E", "pid": 2, "ts": 21},  # a stray end: nothing open on tensor 2
        {"name": "WAIT", "ph": "B", "pid": 2, "ts": 30},
        {"ph": "E", "pid": 2, "ts": 33},
        {"name": "ALLREDUCE", "ph": "B", "pid": 1, "ts": 40},  # cut off: never ends
    ]
    path = write_events(tmp_path / "hand.json", events)
    got = spans(read(path))[["tensor", "name", "start", "end", "depth"]].values.tolist()
    assert got == [
        ["grad", "ALLREDUCE", 10, 20, 0],
        ["bias", "MEMCPY", 11, 16, 0],
        ["grad", "NCCL", 12, 15, 1],
        ["bias", "WAIT", 30, 33, 0],
    ]


def test_real_spans_match_a_stack_per_tensor(real_timelines: dict[str, Path]) -> None:
    for path in real_timelines.values():
        frame = spans(read(path))
        got = sorted(frame[["pid", "name", "start", "end", "depth"]].itertuples(index=False, name=None))
        expected = reference_spans(json.loads(path.read_text()))
        assert got == expected and len(expected) > 0
        assert (frame["duration"] == frame["end"] - frame["start"]).all()


def test_spans_are_computed_once_per_timeline(tmp_path: Path) -> None:
    path = write_events(
        tmp_path / "one.json", [{"name": "A", "ph": "B", "pid": 1, "ts": 1}, {"ph": "E", "pid": 1, "ts": 4}]
    )
    timeline = read(path)
    first = timeline.spans()
    assert spans(timeline) is first and timeline.spans() is first
    assert first[["name", "start", "end", "duration", "depth"]].values.tolist() == [["A", 1, 4, 3, 0]]
    assert read(path).spans() is not first  # each timeline keeps its own


def test_a_timeline_without_spans_gives_an_empty_frame(tmp_path: Path) -> None:
    path = write_events(tmp_path / "marks.json", [{"name": "CYCLE_START", "ph": "i", "ts": 5, "s": "g"}])
    frame = spans(read(path))
    assert frame.empty and list(frame.columns) == [
        "pid",
        "name",
        "start",
        "end",
        "duration",
        "depth",
        "tensor",
    ]
