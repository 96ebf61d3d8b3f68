"""The span store and the viewer's level of detail: the C matcher against the Python one on
random event streams fed in pieces, the per-pixel marks against a brute-force merge, and the
viewer's window requests answered from the kernel."""

from __future__ import annotations

import importlib
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from hvd_magic.timeline import levels as levels_module
from hvd_magic.timeline import merging, read, viewer_data
from hvd_magic.timeline import viewer as viewer_module
from hvd_magic.timeline.detail import Marks, window
from hvd_magic.timeline.levels import MERGE, build_levels
from hvd_magic.timeline.live import Growing, LiveTimeline
from hvd_magic.timeline.matching import Matched, PyMatcher, matched, new_matcher, tensors
from hvd_magic.timeline.merging import Items, merge, merge_numpy
from hvd_magic.timeline.reader import read_general

from .timeline_fixtures import reference_spans, write_events


def random_stream(rng: random.Random, n: int) -> tuple[np.ndarray, ...]:
    """Events as a matcher takes them: B, E (some stray), X marks, other phases, 5 tensors, a
    few without a time."""
    phases = rng.choices(b"BBBEEEXXi", k=n)
    ts = np.cumsum([rng.randrange(0, 50) for _ in range(n)]).astype(np.int64)
    ts[rng.sample(range(n), n // 100)] = np.iinfo(np.int64).min  # events without a time
    return (
        np.array(phases, np.uint8),
        np.array([rng.randrange(-1, 12) for _ in range(n)], np.int32),
        ts,
        np.array([rng.randrange(0, 5) for _ in range(n)], np.int64),
    )


def same_spans(fast, slow, order: np.ndarray, more: bool) -> Matched:
    got, expected = matched(fast, order, more), matched(slow, order, more)
    for key, value in vars(expected).items():
        mine = np.asarray(getattr(got, key))
        assert np.array_equal(mine, value) and mine.dtype == np.asarray(value).dtype, key
    return got


@pytest.mark.parametrize("seed", range(5))
def test_the_c_matcher_matches_the_python_one_fed_in_pieces(seed):
    rng = random.Random(seed)
    ph, name, ts, pid = random_stream(rng, 5_000)
    fast, slow = new_matcher(), PyMatcher()
    assert type(fast).__module__ == "hvd_magic.timeline._match"  # the C one is built and used
    cuts = sorted(rng.sample(range(1, len(ph)), 7))
    for lo, hi in zip([0, *cuts], [*cuts, len(ph)], strict=True):
        fast.feed(ph[lo:hi].data, name[lo:hi].data, ts[lo:hi].data, pid[lo:hi].data)
        slow.feed(ph[lo:hi].data, name[lo:hi].data, ts[lo:hi].data, pid[lo:hi].data)
        for got, expected in zip(tensors(fast), tensors(slow), strict=True):
            assert np.array_equal(got, expected)
        # a growing file: the spans so far, in any order of tensors, some left out
        order = np.array(rng.sample(range(len(tensors(slow)[0])), len(tensors(slow)[0]) - 1), np.int32)
        same_spans(fast, slow, order, more=True)
    pids, closed = tensors(slow)
    got = same_spans(fast, slow, np.arange(len(pids), dtype=np.int32), more=False)
    assert len(got.start) == closed.sum() < (ph == ord("B")).sum()  # spans left open are left out
    assert len(got.ready_span) > 0 and got.duration.dtype == np.uint32
    assert len(tensors(fast)[0]) == 0  # finish starts over


def test_durations_take_32_bits_unless_one_does_not_fit():
    for long in (2**32 - 1, 2**32, -1):  # a span of 71 minutes and more, one that ends before it begins
        ph = np.frombuffer(b"BEBE", np.uint8)
        ts = np.array([0, 5, 10, 10 + long], np.int64)
        for matcher in (new_matcher(), PyMatcher()):
            matcher.feed(ph.data, np.zeros(4, np.int32).data, ts.data, np.zeros(4, np.int64).data)
            spans = matched(matcher, np.zeros(1, np.int32))
            assert spans.duration.tolist() == [5, long]
            assert spans.duration.dtype == (np.uint32 if long < 2**32 and long >= 0 else np.int64)


def test_a_store_of_narrow_columns_reads_as_the_events(tmp_path):
    """Rows and kinds in 8 bits, durations in 32, and a long span (more than 2^32 µs) in 64:
    each span's start, end and kind as the file says."""
    events = [{"name": "process_name", "ph": "M", "pid": p, "args": {"name": f"t{p}"}} for p in (1, 2)]
    for i in range(200):
        events += [{"name": f"K{i % 3}", "ph": "B", "pid": 1 + i % 2, "ts": 10 * i},
                   {"ph": "E", "pid": 1 + i % 2, "ts": 10 * i + 3}]  # fmt: skip
    narrow = read(write_events(tmp_path / "narrow.json", events)).store
    assert (narrow.row.dtype, narrow.kind.dtype, narrow.duration.dtype) == (np.uint8, np.uint8, np.uint32)
    events += [
        {"name": "STALL", "ph": "B", "pid": 2, "ts": 5_000},
        {"ph": "E", "pid": 2, "ts": 5_000 + 2**33},
    ]
    wide = read(write_events(tmp_path / "wide.json", events)).store
    assert wide.duration.dtype == np.int64 and wide.last_end == 5_000 + 2**33 and wide.first_start == 0
    for store in (narrow, wide):
        got = sorted(store.frame()[["tensor", "name", "start", "end"]].itertuples(index=False, name=None))
        expected = sorted((f"t{1 + i % 2}", f"K{i % 3}", 10 * i, 10 * i + 3) for i in range(200))
        assert [g for g in got if g[1] != "STALL"] == expected


def test_readiness_names_the_last_mark_of_each_span(tmp_path):
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "w"}},
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 1, "ts": 0},
        {"name": "1", "ph": "X", "pid": 1, "ts": 3, "dur": 0},
        {"name": "0", "ph": "X", "pid": 1, "ts": 10, "dur": 0},
        {"ph": "E", "pid": 1, "ts": 11},
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 1, "ts": 20},
        {"name": "2", "ph": "X", "pid": 1, "ts": 21, "dur": 0},
        {"ph": "E", "pid": 1, "ts": 22},
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 1, "ts": 30},  # cached: no marks
        {"ph": "E", "pid": 1, "ts": 31},
    ]
    store = read(write_events(tmp_path / "t.json", events)).store
    assert [store.ranks[i] for i in store.ready_rank] == ["0", "2"] and store.ready_wait.tolist() == [7, 0]
    assert store.ready_start.tolist() == [0, 20] and store.ranks == ["0", "1", "2"]


def test_a_tensor_written_out_of_time_order_is_sorted_with_its_marks(tmp_path):
    events = [
        {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 1, "ts": 100},
        {"name": "3", "ph": "X", "pid": 1, "ts": 105, "dur": 0},
        {"ph": "E", "pid": 1, "ts": 110},
        {"name": "ALLREDUCE", "ph": "B", "pid": 1, "ts": 10},  # earlier, written later
        {"ph": "E", "pid": 1, "ts": 20},
    ]
    store = read(write_events(tmp_path / "t.json", events)).store
    assert store.start.tolist() == [10, 100] and store.duration.tolist() == [10, 10]
    assert [store.kind_names[k] for k in store.kind] == ["ALLREDUCE", "NEGOTIATE_ALLREDUCE"]
    assert store.ready_start.tolist() == [100]
    assert store.kind_names[store.ready_kind[0]] == "NEGOTIATE_ALLREDUCE"


def spans_timeline(
    path: Path, rng: random.Random, rows: int = 4, per_row: int = 3_000, long_every: int = 0
) -> Path:
    """Top-level spans with children, of random durations, on a few tensors; every
    ``long_every``-th top-level span lasts 20-200 ms (a stall)."""
    events: list[dict] = []
    durations = iter(rng.sample(range(1, 2_000_000), rows * per_row * 2))
    for pid in range(1, rows + 1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"t{pid}"}})
        at = rng.randrange(0, 1000)
        for index in range(per_row):
            outer = next(durations) % 3_000 + 10
            if long_every and index % long_every == long_every - 1:
                outer = 20_000 + 60 * outer
            inner = next(durations) % outer
            kind = rng.choice(["ALLREDUCE", "BROADCAST", "ALLGATHER"])
            events += [
                {"name": kind, "ph": "B", "pid": pid, "ts": at},
                {"name": "MPI_" + kind, "ph": "B", "pid": pid, "ts": at + 1},
                {"ph": "E", "pid": pid, "ts": at + 1 + inner},
                {"ph": "E", "pid": pid, "ts": at + outer},
            ]
            at += outer + rng.randrange(0, 200)
    return write_events(path, events)


def brute_force_marks(store, t0: int, t1: int, width: int, rows: list[int]) -> list[tuple]:
    """(row, depth, start, end, kind name, count) of each mark, span by span in Python: spans
    narrower than a pixel merged per depth and pixel, then neighbours of one kind less than a
    pixel apart joined (spans a pixel wide or more stay themselves)."""
    pixel_us = (t1 - t0) / width
    marks = []
    for row in rows:
        by_depth: dict[int, list] = {}
        for i in range(store.offsets[row], store.offsets[row + 1]):
            start, duration = int(store.start[i]), int(store.duration[i])
            kind, depth = store.kind_names[store.kind[i]], int(store.depth[i])
            if start + duration < t0 or start > t1:
                continue
            pixel = None if duration >= pixel_us else min(max(int((start - t0) / pixel_us), 0), width - 1)
            groups = by_depth.setdefault(depth, [])
            last = groups[-1] if groups else None
            if pixel is not None and last is not None and last["pixel"] == pixel:
                last["end"], last["count"] = max(last["end"], start + duration), last["count"] + 1
                if (duration, kind) > (last["longest"], last["kind"]):  # ties: the later kind
                    last["kind"], last["longest"] = kind, duration
            else:
                groups.append({"pixel": pixel, "start": start, "end": start + duration, "kind": kind,
                               "longest": duration, "count": 1})  # fmt: skip
        for depth, groups in by_depth.items():
            joined: list[dict] = []
            for before, group in zip([None, *groups], groups, strict=False):  # each and the one before
                group["alone"] = group["count"] == 1 and group["end"] - group["start"] >= pixel_us
                if (
                    before is not None and not group["alone"] and not before["alone"]
                    and before["kind"] == group["kind"] and group["start"] - before["end"] < pixel_us
                ):  # fmt: skip
                    joined[-1]["end"] = max(joined[-1]["end"], group["end"])
                    joined[-1]["count"] += group["count"]
                else:
                    joined.append(dict(group))
            marks += [(row, depth, g["start"], g["end"], g["kind"], g["count"]) for g in joined]
    return sorted(marks)


def mark_tuples(store, marks, origin: int) -> list[tuple]:
    return sorted(
        (int(r), int(d), int(s) + origin, round(s + dur) + origin, store.kind_names[k], int(c))
        for r, d, s, dur, k, c in zip(
            marks.row, marks.depth, marks.start, marks.duration, marks.kind, marks.count, strict=True
        )
    )


def test_pixel_marks_match_a_brute_force_merge(tmp_path):
    store = read(spans_timeline(tmp_path / "t.json", random.Random(5))).store
    origin, end = int(store.start.min()), int(store.end.max())
    for t0, t1, width in (
        (origin, end, 300),
        (origin + (end - origin) // 3, origin + (end - origin) // 2, 500),
    ):
        rows = [0, 2, 3]
        marks = window(store, t0, t1, width, rows, limit=0, origin=origin)
        assert 0 < len(marks) < store.offsets[-1]  # merged: fewer marks than spans
        assert mark_tuples(store, marks, origin) == brute_force_marks(store, t0, t1, width, rows)
        assert all((np.diff(marks.start[marks.row == r]) >= 0).all() for r in rows)


def test_levels_of_detail_answer_wide_windows_as_the_spans_would(tmp_path, monkeypatch):
    path = spans_timeline(tmp_path / "t.json", random.Random(8), rows=5, per_row=4_000, long_every=97)
    store = read(path).store
    levels = build_levels(store, smallest=500)
    assert len(levels) >= 3 and [lv.bucket for lv in levels] == [
        levels[0].bucket * 2**k for k in range(len(levels))
    ]
    assert len(levels[0].items) * MERGE <= 2 * len(store)  # the finest level merges spans about MERGE to one
    assert (store.duration >= 4 * levels[0].bucket).sum() > 20  # spans that stay themselves in a level
    for level in levels:  # every span is in exactly one item of each level, no item crosses a run
        assert level.items.count.sum() == len(store) and level.items.count.dtype == np.uint32
        assert (np.diff(level.offsets) >= 0).all() and level.offsets[-1] == len(level.items)
    origin, rows = int(store.start.min()), [0, 1, 3, 4]
    for level in levels:
        # a window from the start whose pixels hold whole buckets: the level's answer is the spans'
        for pixel in (level.bucket, 2 * level.bucket):
            t1 = origin + 300 * pixel
            from_spans = window(store, origin, t1, 300, rows, limit=0, origin=origin)
            from_level = window(store, origin, t1, 300, rows, limit=0, origin=origin, levels=levels)
            assert mark_tuples(store, from_level, origin) == mark_tuples(store, from_spans, origin)
            assert mark_tuples(store, from_spans, origin) == brute_force_marks(store, origin, t1, 300, rows)
    # a long span that starts before a window reaches into it, from a level as from the spans
    finest = levels[0].bucket
    long = next(i for i in np.flatnonzero(store.duration > 8 * finest) if store.row[i] in rows)
    t0 = origin + ((int(store.start[long]) - origin) // finest + 2) * finest  # inside the span
    for levels_used in ((), levels):
        marks = window(store, t0, t0 + 300 * finest, 300, rows, 0, origin, levels_used)
        starts = (marks.start + origin).astype(np.int64)
        assert ((starts == store.start[long]) & (marks.count == 1) & (marks.row == store.row[long])).any()
    # levels merged by numpy a few rows at a time are the same levels
    monkeypatch.setattr(merging, "BATCH", 1_000)
    monkeypatch.setattr(levels_module, "merge", merging._in_batches)
    for small, whole in zip(build_levels(store, smallest=500), levels, strict=True):
        assert small.bucket == whole.bucket and np.array_equal(small.offsets, whole.offsets)
        columns = zip(vars(small.items).values(), vars(whole.items).values(), strict=True)
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in columns)
    # and the level is what answers: the coarsest holds far fewer items than the spans
    assert len(levels[-1].items) < len(store) / 8


@pytest.mark.parametrize("seed", range(6))
def test_the_c_merge_matches_numpys(seed):
    """Per pixel of a window (clipped, joined) and per bucket of a level, spans or merged items,
    rows asked in any order: the one-pass C merge gives what the numpy one gives."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 400, 6)
    n = int(sizes.sum())
    start = np.concatenate([np.sort(rng.integers(0, 100_000, s)) for s in sizes]).astype(np.int64)
    duration = rng.integers(0, 3_000, n).astype(np.uint32 if seed % 2 else np.int64)
    merged = seed % 3 == 0  # items that stand for several spans, as a level's
    items = Items(
        start=start,
        duration=duration,
        longest=(duration * rng.random(n)).astype(duration.dtype) if merged else None,
        kind=rng.integers(0, 5, n).astype([np.uint8, np.uint16, np.uint32][seed % 3]),
        depth=rng.integers(0, 3, n).astype(np.uint8),
        count=rng.integers(1, 4, n).astype(np.uint32) if merged else None,
    )
    offsets = np.r_[0, np.cumsum(sizes)].tolist()
    rows = [(offsets[r], offsets[r + 1]) for r in rng.permutation(6).tolist()]
    rows.append((offsets[2] + 1, max(offsets[2] + 1, offsets[3] - 1)))  # part of a row
    assert hasattr(importlib.import_module("hvd_magic.timeline._match"), "merge")  # the C merge is built
    asked = sum(hi - lo for lo, hi in rows)
    for t0, pixel, width in ((0, 700.0, 0), (20_000, 137.5, 300), (-5_000, 2_000.0, 40)):
        got, got_rows = merge(items, rows, t0, pixel, width)
        expected, expected_rows = merge_numpy(items, rows, t0, pixel, width)
        assert got_rows.tolist() == expected_rows.tolist() and 0 < len(got) < asked
        for key, value in vars(expected).items():
            assert np.array_equal(getattr(got, key), value), (key, t0, width)
        assert got.kind.dtype == items.kind.dtype
        if width == 0:  # a level: every item is in one merged item
            assert got.count.sum() == sum(int(items.counts()[lo:hi].sum()) for lo, hi in rows)


def test_without_the_c_extension_the_store_levels_and_windows_are_the_same(tmp_path, monkeypatch):
    """An install without a C compiler: the Python matcher and numpy's merge give what C gives."""
    path = spans_timeline(tmp_path / "t.json", random.Random(11), rows=3, per_row=1_500, long_every=50)
    fast = read(path).store
    fast_levels = build_levels(fast, smallest=200)
    monkeypatch.setitem(sys.modules, "hvd_magic.timeline._match", None)  # imports of it fail
    slow = read(path).store
    assert type(new_matcher()) is PyMatcher
    for key in ("start", "duration", "row", "kind", "depth", "offsets", "max_duration", "ready_start"):
        assert (
            np.array_equal(getattr(slow, key), getattr(fast, key))
            and getattr(slow, key).dtype == getattr(fast, key).dtype
        )
    slow_levels = build_levels(slow, smallest=200)
    assert [lv.bucket for lv in slow_levels] == [lv.bucket for lv in fast_levels] and len(slow_levels) >= 2
    for a, b in zip(slow_levels, fast_levels, strict=True):
        assert all(
            np.array_equal(x, y) for x, y in zip(vars(a.items).values(), vars(b.items).values(), strict=True)
        )
    origin, end = slow.first_start, slow.last_end
    for levels in ((), slow_levels):
        got = window(slow, origin, end, 300, [0, 2], 0, origin, levels)
        expected = window(fast, origin, end, 300, [0, 2], 0, origin, fast_levels if levels else ())
        assert mark_tuples(slow, got, origin) == mark_tuples(fast, expected, origin)


def test_a_window_with_few_spans_gets_them_all(tmp_path):
    store = read(spans_timeline(tmp_path / "t.json", random.Random(6), rows=2, per_row=200)).store
    origin, end = int(store.start.min()), int(store.end.max())
    marks = window(store, origin, end, 100, [0, 1], limit=len(store), origin=origin)
    assert len(marks) == len(store) and set(marks.count.tolist()) == {1}
    assert sorted(marks.start + origin) == sorted(store.start.tolist())


def test_a_reply_counts_starts_from_its_first_in_32_bits_unless_they_do_not_fit():
    def marks(*starts: float) -> Marks:
        n = len(starts)
        return Marks(np.array(starts), np.ones(n, np.float32), np.array([0, 2, 2][:n], np.int32),
                     np.zeros(n, np.uint16), np.zeros(n, np.uint8), np.ones(n, np.uint32))  # fmt: skip

    fields, buffers = marks(7.0, 9.0, 2.0**32 + 6).packed([0, 1, 2])
    assert fields == {"base": 7, "start_bits": 32} and np.frombuffer(buffers[0], np.uint32).tolist() == [
        0,
        2,
        2**32 - 1,
    ]
    assert np.frombuffer(buffers[2], np.int32).tolist() == [1, 0, 2]  # marks per row asked
    fields, buffers = marks(7.0, 9.0, 2.0**32 + 7).packed([0, 2])
    assert fields == {"base": 0, "start_bits": 64} and np.frombuffer(buffers[0]).tolist() == [7, 9, 2**32 + 7]


class Sent(list):
    def __call__(self, content, buffers=None):
        self.append((content, buffers))


def test_a_large_timeline_is_sent_as_an_overview_and_windows_on_request(tmp_path, monkeypatch):
    timeline = read(spans_timeline(tmp_path / "t.json", random.Random(7), rows=6, per_row=2_000))
    monkeypatch.setattr(viewer_data, "DIRECT_SPANS", 1_000)
    viewer = viewer_module.TimelineViewer.from_timeline(timeline, width=400)
    assert viewer.lod and len(viewer.counts) == 4 * (len(viewer.starts) // 8)
    overview = int(np.frombuffer(viewer.counts, np.uint32).sum())
    assert overview == len(timeline.store) > len(viewer.starts) // 8  # every span, in fewer marks
    sent = Sent()
    monkeypatch.setattr(viewer, "send", sent)
    third = viewer.end_us / 3
    viewer._answer(
        viewer, {"type": "window", "id": 4, "t0": third, "t1": 2 * third, "width": 300, "rows": [1, 4]}, []
    )
    ((content, buffers),) = sent
    assert content.pop("kernel_ms") >= 0  # the kernel's time, which the front end records
    base = content.pop("base")
    # the window and half of it on each side, starts in 32 bits after the first one's
    assert content == {
        "type": "spans",
        "id": 4,
        "t0": third / 2,
        "t1": 2.5 * third,
        "rows": [1, 4],
        "start_bits": 32,
    }
    starts = base + np.frombuffer(buffers[0], np.uint32).astype(np.float64)
    per_row, counts = np.frombuffer(buffers[2], np.int32), np.frombuffer(buffers[5], np.uint32)
    assert len(buffers) == 6 and per_row.sum() == len(starts) == len(counts) and (per_row > 0).all()
    reply, marks = viewer.detail(third, 2 * third, 300, [1, 4])
    assert starts.tolist() == marks.start.tolist() and counts.sum() < len(timeline.store)
    for bad in ({"type": "window", "id": 5, "t0": 2, "t1": 1, "width": 10, "rows": [0]},
                {"type": "window", "id": 6, "t0": 0, "t1": 1, "width": 10, "rows": [99]},
                {"type": "window", "id": 7, "rows": "all"}):  # fmt: skip
        viewer._answer(viewer, bad, [])
        content, buffers = sent[-1]
        assert content["id"] == bad["id"] and content["rows"] == [] and not any(buffers)
    viewer._answer(viewer, {"type": "other"}, [])
    assert len(sent) == 4


def test_a_small_timeline_goes_over_whole(tmp_path):
    timeline = read(spans_timeline(tmp_path / "t.json", random.Random(8), rows=2, per_row=100))
    viewer = viewer_module.TimelineViewer.from_timeline(timeline)
    assert not viewer.lod and viewer.counts == b"" and len(viewer.starts) // 8 == len(timeline.store)


def test_a_growing_file_is_read_incrementally(tmp_path):
    """Rank 0's timeline arrives in pieces that may end inside an event: each update reads the
    new bytes only and gives the spans of the whole events so far; the last equals read()."""
    rng = random.Random(9)
    path = spans_timeline(tmp_path / "whole.json", rng, rows=3, per_row=400)
    raw = path.read_bytes()
    events = json.loads(raw)
    growing_path = tmp_path / "growing.json"
    growing_path.write_bytes(b"")
    growing = Growing(str(growing_path))
    assert growing.update() is None  # nothing written yet
    cuts = sorted(rng.sample(range(1, len(raw)), 12)) + [len(raw)]
    written, seen = 0, []
    for cut in cuts:
        with open(growing_path, "ab") as out:
            out.write(raw[written:cut])
        written = cut
        timeline = growing.update()
        if timeline is None:
            continue
        whole_events = json.loads(raw[: raw.rfind(b"},", 0, cut) + 1] + b"]") if cut < len(raw) else events
        got = sorted(
            timeline.spans()[["pid", "name", "start", "end", "depth"]].itertuples(index=False, name=None)
        )
        assert got == reference_spans(whole_events)
        seen.append(len(got))
    assert len(seen) >= 5 and seen == sorted(seen) and seen[0] < seen[-1]
    final = read(path)
    assert timeline.store.start.tolist() == final.store.start.tolist()
    assert timeline.store.row_names == final.store.row_names == ["t1", "t2", "t3"]


def test_events_without_a_phase_or_a_time_make_no_span(tmp_path):
    events = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "w"}},
        {"ph": "B", "name": "A", "ts": 1, "pid": 0},
        {"name": "junk", "ts": 2, "pid": 0},  # no phase
        {"ph": "B", "name": "no time", "pid": 0},
        {"ph": "E", "ts": 3, "pid": 0},
        {"ph": "E", "pid": 0},
    ]
    path = write_events(tmp_path / "odd.json", events)
    for timeline in (read(path), read_general(str(path))):
        assert timeline.spans()[["name", "start", "end"]].values.tolist() == [["A", 1, 3]]


def test_a_newer_store_keeps_the_viewers_activity_indices(tmp_path):
    """A growing file's later snapshot may bring activities that sort first: the front end's
    checkboxes and colours are by index, so the old ones keep theirs."""
    first = [{"ph": "B", "name": "QUEUE", "ts": 1, "pid": 1}, {"ph": "E", "ts": 5, "pid": 1}]
    later = [*first, {"ph": "B", "name": "ALLREDUCE", "ts": 6, "pid": 1}, {"ph": "E", "ts": 9, "pid": 1}]
    viewer = viewer_module.TimelineViewer.from_timeline(read(write_events(tmp_path / "a.json", first)))
    assert viewer.activity_names == ["QUEUE"]
    viewer.show(read(write_events(tmp_path / "b.json", later)).store)
    assert viewer.activity_names == ["QUEUE", "ALLREDUCE"]
    assert np.frombuffer(viewer.kinds, np.uint16).tolist() == [0, 1]  # by start: QUEUE, then ALLREDUCE


def test_window_requests_far_outside_the_run_are_answered(tmp_path, monkeypatch):
    timeline = read(spans_timeline(tmp_path / "t.json", random.Random(3), rows=2, per_row=50))
    viewer = viewer_module.TimelineViewer.from_timeline(timeline)
    sent = Sent()
    monkeypatch.setattr(viewer, "send", sent)
    viewer._answer(
        viewer, {"type": "window", "id": 1, "t0": -1e300, "t1": 1e300, "width": 100, "rows": [0]}, []
    )
    ((content, buffers),) = sent
    assert content["rows"] == [0] and len(np.frombuffer(buffers[0], np.uint32)) == timeline.store.offsets[1]


def test_the_live_view_waits_for_this_runs_file_and_never_stops_the_run(tmp_path, monkeypatch):
    path = spans_timeline(tmp_path / "earlier_run.json", random.Random(4), rows=1, per_row=20)
    path.write_bytes(path.read_bytes().rstrip(b"]") + b",")  # still being written: no closing "]"
    clock = iter(range(0, 10_000, 10)).__next__  # 10 s per call: every tick is due
    written: list[bool] = []
    live = LiveTimeline(str(path), lambda: bool(written), clock=clock)
    assert not live.tick() and live.viewer is None  # the file there may be an earlier run's
    written.append(True)
    shown = []
    monkeypatch.setattr(LiveTimeline, "_show", lambda self, timeline: shown.append(len(timeline.store)))
    assert live.tick() and shown == [40]

    def broken_show(self, timeline):
        raise ModuleNotFoundError("No module named 'anywidget'")

    monkeypatch.setattr(LiveTimeline, "_show", broken_show)
    with open(path, "ab") as out:  # more events arrive, and showing them fails
        out.write(b'{"ph": "B", "name": "A", "ts": 1, "pid": 7}, {"ph": "E", "ts": 2, "pid": 7},')
    assert live.tick() and live.growing.broken  # told, not raised: the run goes on
    assert not live.tick()


def test_a_file_rewritten_from_the_start_is_not_read_as_growing(tmp_path):
    path = spans_timeline(tmp_path / "t.json", random.Random(5), rows=1, per_row=20)
    growing = Growing(str(path))
    assert growing.update() is not None
    path.write_bytes(b'[{"ph": "B", "name": "A", "ts": 1, "pid": 1},')
    assert growing.update() is None and growing.broken
