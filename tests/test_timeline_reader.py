"""The timeline reader (hvd_magic.timeline.reader and its backends _fast, _arrow): real files from
mpi and gloo runs, truncated copies, malformed files, chunk boundaries, metadata."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

import hvd_magic.errors
import hvd_magic.timeline
from hvd_magic.timeline import Timeline, TimelineError, read, reader, spans
from hvd_magic.timeline.reader import metadata, read_fast, read_general

from .timeline_fixtures import real_timelines, reference_spans, write_events

__all__ = ["real_timelines"]  # a fixture, used by name

PACKAGE = Path(hvd_magic.timeline.__file__).parent
COLUMNS = ["ph", "name", "ts", "pid", "dur"]
SPAN = ["pid", "name", "start", "end", "depth"]


def test_truncated_copies_keep_every_complete_event(real_timelines: dict[str, Path], tmp_path: Path) -> None:
    data = real_timelines["mpi"].read_bytes()
    every_event = json.loads(data)
    full = len(read(real_timelines["mpi"]))
    counts = []
    for fraction in (0.2, 0.5, 0.77, 0.99):
        cut = tmp_path / f"cut-{fraction}.json"
        cut.write_bytes(data[: int(len(data) * fraction)])
        timeline = read(cut)
        assert not timeline.closed
        counts.append(len(timeline))
        # Unmatched spans are dropped, not fatal: the spans are those of the events kept.
        got = sorted(spans(timeline)[SPAN].itertuples(index=False, name=None))
        assert got == reference_spans(every_event[: len(timeline)])
    assert counts == sorted(counts) and counts[-1] < full
    no_bracket = tmp_path / "pre-0.20.json"
    no_bracket.write_bytes(data.rstrip()[:-1])  # the form without the closing ']'
    assert len(read(no_bracket)) == full
    mid_event = tmp_path / "mid-event.json"
    mid_event.write_bytes(data[: data.rindex(b'"ts"')])  # cut inside the last event
    assert read(mid_event).truncated and len(read(mid_event)) == full - 1


def test_events_count_matches_json(real_timelines: dict[str, Path]) -> None:
    assert len(read(real_timelines["gloo"])) == len(json.loads(real_timelines["gloo"].read_text()))


def _after_args(data: bytes, start: int) -> int:
    """The offset right after the first event from ``start`` whose "args" has braces too (an E
    event), whatever separates events (Horovod writes "},\n{")."""
    found = re.compile(rb"}}\s*,\s*{").search(data, start)
    assert found is not None
    return found.start() + 2


def test_garbage_names_the_file_and_byte_offset(real_timelines: dict[str, Path], tmp_path: Path) -> None:
    data = real_timelines["mpi"].read_bytes()
    at = _after_args(data, len(data) // 2)
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


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_fast_and_general_readers_agree(real_timelines: dict[str, Path], launcher: str) -> None:
    path = str(real_timelines[launcher])
    fast, general = read_fast(path), read_general(path)
    assert fast is not None  # plain Horovod output takes the C scanner
    assert len(fast) == len(general) and fast.tensors == general.tensors
    assert fast.start_epoch_us == general.start_epoch_us and (fast.closed, fast.truncated) == (True, False)
    assert fast.events.select(COLUMNS).to_pylist() == general.events.select(COLUMNS).to_pylist()
    assert fast.events.schema.field("args").type == general.events.schema.field("args").type
    assert _metadata_args(fast) == _metadata_args(general)
    assert fast.start_epoch_us is not None and fast.start_epoch_us > 0


def _metadata_args(timeline: Timeline) -> list[object]:
    """The args the schema keeps (tensor name, start time), of the metadata events."""
    events = timeline.events
    return events.filter(pc.equal(events["ph"].cast("string"), "M"))["args"].to_pylist()


def test_unusual_layouts_fall_back_to_the_general_reader(tmp_path: Path) -> None:
    odd = tmp_path / "odd.json"
    odd.write_text(
        '[{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad \\"a\\""}},\n'
        '{"ph": "B", "name": "ALLREDUCE", "ts": 1, "pid": 1},{"ph": "E", "ts": 3, "pid": 1}]'
    )
    assert read_fast(str(odd)) is None  # escaped quotes: the scanner leaves them to Arrow
    timeline = read(odd)
    assert len(timeline) == 3 and timeline.tensors == {1: 'grad "a"'}


def test_chunk_boundaries_change_nothing(
    real_timelines: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = real_timelines["mpi"]
    whole = read_general(str(path))
    monkeypatch.setattr(reader, "CHUNK_BYTES", 300)  # hundreds of chunks, some shorter than an event
    for small in (read_fast(str(path)), read_general(str(path))):
        assert small is not None
        assert small.events.select(COLUMNS).to_pylist() == whole.events.select(COLUMNS).to_pylist()
        assert (small.tensors, small.start_epoch_us) == (whole.tensors, whole.start_epoch_us)
    data = path.read_bytes()
    at = _after_args(data, 2 * len(data) // 3)
    bad = tmp_path / "bad.json"
    bad.write_bytes(data[:at] + b"#junk#" + data[at:])
    event_start = data.rfind(b'{"ph"', 0, at)
    with pytest.raises(TimelineError, match=f"byte {event_start}:"):
        read(bad)


def test_metadata_names_tensors_from_process_name_events(tmp_path: Path) -> None:
    rows = [
        ("process_name", 0, {"start_time_since_epoch_in_micros": 1700000000000000}),
        ("process_name", 1, {"name": "grad"}),
        ("thread_name", 2, {"name": "not a tensor"}),
        ("process_sort_index", 1, {"sort_index": 1}),
        ("process_name", None, {"name": "no pid"}),
        ("process_name", 3, None),
    ]
    assert metadata(rows) == ({1: "grad"}, 1700000000000000)
    events = [{"name": name, "ph": "M", "pid": pid, "args": args} for name, pid, args in rows[:4]]
    path = write_events(tmp_path / "meta.json", events)
    fast, general = read_fast(str(path)), read_general(str(path))
    assert fast is not None and (fast.tensors, fast.start_epoch_us) == ({1: "grad"}, 1700000000000000)
    assert (general.tensors, general.start_epoch_us) == (fast.tensors, fast.start_epoch_us)
    assert _metadata_args(fast) == _metadata_args(general)


@pytest.mark.parametrize(
    ("args", "read_as"),
    [('"x"', {}), ("null", {}), ('{"name": "a", "x": tru}', None)],
    ids=["text", "null", "bad"],
)
def test_metadata_args_that_are_not_an_object_are_none_and_bad_json_a_timeline_error(
    tmp_path: Path, args: str, read_as: dict | None
) -> None:
    """They raised AttributeError or JSONDecodeError, from read() or later from .events."""
    path = tmp_path / "odd-args.json"
    path.write_text(
        f'[{{"name": "process_name", "ph": "M", "pid": 1, "args": {args}}},\n'
        '{"ph": "B", "name": "ALLREDUCE", "ts": 1, "pid": 1},\n{"ph": "E", "ts": 3, "pid": 1}]'
    )
    if read_as is None:
        with pytest.raises(TimelineError, match="not a Horovod Timeline"):
            read(path)
        return
    timeline = read(path)
    assert timeline.tensors == {} and len(timeline.events) == 3 and len(spans(timeline)) == 1


def test_a_fractional_or_huge_time_is_read_or_refused_never_wrapped(tmp_path: Path) -> None:
    """Fractional microseconds (other tools' traces) were refused by the general reader; a time
    past int64 wrapped around in the scanner, giving a span of minus 7.7e18 us."""
    fraction = write_events(
        tmp_path / "fraction.json",
        [{"ph": "B", "name": "ALLREDUCE", "ts": 1.4, "pid": 1}, {"ph": "E", "ts": 3.6, "pid": 1}],
    )
    assert spans(read(fraction))[["start", "end"]].values.tolist() == [[1, 4]]
    huge = tmp_path / "huge.json"
    huge.write_text(
        '[{"ph": "B", "name": "A", "ts": 1, "pid": 1},{"ph": "E", "ts": 99999999999999999999, "pid": 1}]'
    )
    with pytest.raises(TimelineError, match="not a Horovod Timeline"):
        read(huge)


def test_timeline_error_is_the_one_from_hvd_magic_errors() -> None:
    assert hvd_magic.timeline.TimelineError is hvd_magic.errors.TimelineError
    assert issubclass(TimelineError, hvd_magic.errors.HorovodMagicError)
    assert issubclass(TimelineError, ValueError)


def test_read_loads_neither_pandas_nor_arrow(real_timelines: dict[str, Path]) -> None:
    code = (
        "import sys; from hvd_magic.timeline import read; timeline = read(sys.argv[1]); "
        "print(len(timeline), [m for m in ('pandas', 'pyarrow') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(real_timelines["mpi"])], capture_output=True, text=True, check=True
    )
    assert done.stdout.split(" ", 1) == [str(len(read(real_timelines["mpi"]))), "[]\n"]


def _imports_in_package(path: Path) -> set[str]:
    """The timeline modules a module imports (at any level, TYPE_CHECKING included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
    return {name.split(".")[0] for name in found}


def test_timeline_modules_import_without_cycles() -> None:
    graph = {path.stem: _imports_in_package(path) for path in PACKAGE.glob("*.py")}
    assert not graph["_fast"] & {"reader", "_arrow"} and not graph["_arrow"] & {"reader", "_fast"}
    assert "reader" not in graph["matching"]

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for name in graph.get(start, set()) - seen:
            seen.add(name)
            if name == target or reaches(name, target, seen):
                return True
        return False

    assert [name for name in graph if reaches(name, name, set())] == []
