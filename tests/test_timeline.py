"""Horovod Timelines from real runs (mpi and gloo), truncated copies, and malformed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from hvd_magic.timeline import TimelineError, analyze, export_slice, read, spans

TRAIN = """
import horovod.torch as hvd, torch
hvd.init()
model = torch.nn.Linear(10, 10)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
hvd.rank()
"""


@pytest.fixture(scope="module")
def real_timelines(tmp_path_factory):
    """Timelines written by real Horovod runs through %%horovod timeline=PATH."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext hvd_magic")
    folder = tmp_path_factory.mktemp("timelines")
    paths = {}
    for launcher, option in (("mpi", "timeline"), ("gloo", "timeline")):
        paths[launcher] = folder / f"{launcher}.json"
        assert (
            shell.run_cell_magic("horovod", f"np=-2 launcher={launcher} {option}={paths[launcher]}", TRAIN)
            == 0
        )
    cycles = folder / "cycles.json"
    shell.run_cell_magic("horovod", f"np=-2 timeline={cycles}", TRAIN)
    return paths


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_real_timeline_parses_and_analyses(real_timelines, launcher):
    timeline = read(real_timelines[launcher])
    assert timeline.closed and not timeline.truncated
    assert set(timeline.tensors.values()) == {"allreduce.weight", "allreduce.bias"}
    frame = spans(timeline)
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= set(frame["name"])
    assert (frame["duration"] >= 0).all() and (frame["end"] >= frame["start"]).all()
    inner = set(frame[frame["depth"] > 0]["name"])
    assert any(name.endswith("ALLREDUCE") for name in inner)  # MPI_ALLREDUCE or GLOO_ALLREDUCE
    analysis = analyze(timeline)
    assert analysis.per_activity.loc["ALLREDUCE", "count"] == frame["name"].eq("ALLREDUCE").sum()
    assert set(analysis.last_ready.index) <= {"0", "1"} and analysis.last_ready["times last"].sum() > 0
    assert "time per activity" in analysis.to_html()


def test_truncated_copies_keep_every_complete_event(real_timelines, tmp_path):
    data = real_timelines["mpi"].read_bytes()
    full = len(read(real_timelines["mpi"]))
    counts = []
    for fraction in (0.2, 0.5, 0.77, 0.99):
        cut = tmp_path / f"cut-{fraction}.json"
        cut.write_bytes(data[: int(len(data) * fraction)])
        timeline = read(cut)
        assert not timeline.closed
        counts.append(len(timeline))
        assert len(spans(timeline)) >= 0  # unmatched spans are dropped, not fatal
    assert counts == sorted(counts) and counts[-1] < full
    no_bracket = tmp_path / "pre-0.20.json"
    no_bracket.write_bytes(data.rstrip()[:-1])  # the form without the closing ']'
    assert len(read(no_bracket)) == full
    mid_event = tmp_path / "mid-event.json"
    mid_event.write_bytes(data[: data.rindex(b'"ts"')])  # cut inside the last event
    assert read(mid_event).truncated and len(read(mid_event)) == full - 1


def test_events_count_matches_json(real_timelines):
    assert len(read(real_timelines["gloo"])) == len(json.loads(real_timelines["gloo"].read_text()))


def test_garbage_names_the_file_and_byte_offset(real_timelines, tmp_path):
    data = real_timelines["mpi"].read_bytes()
    at = data.index(b"}},{", len(data) // 2) + 2  # right after an E event whose "args" has braces too
    bad = tmp_path / "bad.json"
    bad.write_bytes(data[:at] + b"#junk#" + data[at:])
    with pytest.raises(TimelineError) as info:
        read(bad)
    message = str(info.value)
    assert str(bad) in message and "byte " in message
    offset = int(message.split("byte ")[1].split(":")[0])
    # The offset is where the damaged event starts (an E event's "args" has a "{" of its own).
    event_start = max(data.rfind(b'{"ph"', 0, at), data.rfind(b'{"name": "process_', 0, at))
    assert offset == event_start
    for content, fragment in ((b"", "empty"), (b"hello", r"starts with '\['")):
        other = tmp_path / "other.json"
        other.write_bytes(content)
        with pytest.raises(TimelineError, match=fragment):
            read(other)


def test_export_slice_opens_as_chrome_trace(real_timelines, tmp_path):
    timeline = read(real_timelines["mpi"])
    frame = spans(timeline)
    start, end = int(frame["start"].quantile(0.3)), int(frame["start"].quantile(0.7))
    out = tmp_path / "slice.json"
    written = export_slice(timeline, out, start, end)
    events = json.loads(out.read_text())
    assert len(events) == written > 0
    assert all(start <= e["ts"] <= end for e in events if e["ph"] != "M")
    for pid in {e.get("pid") for e in events if e["ph"] in "BE"}:
        phases = [e["ph"] for e in events if e.get("pid") == pid and e["ph"] in "BE"]
        assert phases.count("B") == phases.count("E")


def test_timeline_magic_shows_analysis_and_refuses_missing_files(ip, real_timelines, capsys):
    ip.run_line_magic("horovod_timeline", str(real_timelines["mpi"]))
    with pytest.raises(UsageError, match="no such file"):
        ip.run_line_magic("horovod_timeline", "/nonexistent/timeline.json")
    with pytest.raises(UsageError, match="folder .* does not exist"):
        ip.run_cell_magic("horovod", "np=-2 timeline=/nonexistent/x.json", "1")


def test_timeline_on_writes_next_to_the_notebook(ip, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ip.run_cell_magic("horovod", "np=-2 timeline=cycles", TRAIN)
    (written,) = Path(tmp_path).glob("horovod_timeline-*.json")
    timeline = read(written)
    assert analyze(timeline).cycles > 0  # cycles=on marks them


def test_viewer_columns_are_sorted_by_row_then_start(real_timelines):
    import numpy as np

    from hvd_magic.timeline.viewer import TimelineViewer

    timeline = read(real_timelines["mpi"])
    viewer = TimelineViewer.from_timeline(timeline)
    starts = np.frombuffer(viewer.starts, np.float64)
    rows = np.frombuffer(viewer.rows, np.int32)
    durations = np.frombuffer(viewer.durations, np.float32)
    assert len(starts) == len(rows) == len(durations) == len(spans(timeline))
    assert (np.diff(rows) >= 0).all()
    for row in np.unique(rows):
        assert (np.diff(starts[rows == row]) >= 0).all()
    assert viewer.row_names == sorted(timeline.tensors.values())
    assert starts.min() == 0 and viewer.end_us >= (starts + durations).max() - 1


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_fast_and_general_readers_agree(real_timelines, launcher):
    from hvd_magic.timeline.parse import read_general
    from hvd_magic.timeline.scan import read_fast

    path = str(real_timelines[launcher])
    fast, general = read_fast(path), read_general(path)
    assert fast is not None  # plain Horovod output takes the C scanner
    assert len(fast) == len(general) and fast.tensors == general.tensors
    assert fast.start_epoch_us == general.start_epoch_us and (fast.closed, fast.truncated) == (True, False)
    columns = ["ph", "name", "ts", "pid", "dur"]
    assert fast.events.select(columns).to_pylist() == general.events.select(columns).to_pylist()
    assert fast.events.schema.field("args").type == general.events.schema.field("args").type


def test_unusual_layouts_fall_back_to_the_general_reader(tmp_path):
    from hvd_magic.timeline.scan import read_fast

    odd = tmp_path / "odd.json"
    odd.write_text(
        '[{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad \\"a\\""}},\n'
        '{"ph": "B", "name": "ALLREDUCE", "ts": 1, "pid": 1},{"ph": "E", "ts": 3, "pid": 1}]'
    )
    assert read_fast(str(odd)) is None  # escaped quotes: the scanner leaves them to Arrow
    timeline = read(odd)
    assert len(timeline) == 3 and timeline.tensors == {1: 'grad "a"'}


def test_spans_pair_by_depth_per_tensor_and_drop_the_unmatched(tmp_path):
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
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(events))
    got = spans(read(path))[["tensor", "name", "start", "end", "depth"]].values.tolist()
    assert got == [
        ["grad", "ALLREDUCE", 10, 20, 0],
        ["bias", "MEMCPY", 11, 16, 0],
        ["grad", "NCCL", 12, 15, 1],
        ["bias", "WAIT", 30, 33, 0],
    ]
