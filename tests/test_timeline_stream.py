"""The timeline's way from rank 0's file to the notebook's copy, under any timing.

A model of Horovod's writer (each event ends ``}]``; before the next, the ``]`` is overwritten
by ``,``; bytes reach the disk in pieces cut anywhere, as an ofstream flushes them) runs against
the real ``TimelineStream`` and ``RankFiles``. Reads are torn the way a real ``read()`` can be
(several system calls, the writer going on in between). Whatever hypothesis picks, the copy
parses and holds exactly the events the writer completed, in order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_magic.protocol import FileChunk, Message, Record
from hvd_magic.rank.timeline_events import EventCutter
from hvd_magic.rank.timeline_stream import TimelineStream
from hvd_magic.run.rank_files import RankFiles

from .helpers import single_process_env

# Strings that trouble a naive cutter: braces, brackets, commas, quotes and escapes inside.
_text = st.text(alphabet=st.sampled_from(list('ab }{][,"\\:é\n')), max_size=8)
_leaf = st.one_of(st.integers(-5, 10**12), _text, st.booleans(), st.none())
_args = st.recursive(
    st.dictionaries(_text, _leaf, max_size=3),
    lambda inner: st.dictionaries(_text, st.one_of(_leaf, inner), max_size=3),
    max_leaves=6,
)
_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["B", "E", "X", "i", "M"]), "ts": st.integers(0, 10**9), "pid": st.integers(0, 9)},
    optional={"name": _text, "args": _args},
)


def serialize(event: dict[str, Any], spaced: bool) -> bytes:
    return json.dumps(
        event, ensure_ascii=not spaced, separators=(", ", ": ") if spaced else (",", ":")
    ).encode()


class HorovodWriter:
    """Horovod's ``TimelineWriter`` as its file sees it. ``pieces`` are the write system calls
    in order: (offset, bytes); a seek (the ``,`` over the ``]``) always starts a new one."""

    def __init__(self, events: list[bytes], cuts: list[int]) -> None:
        segments: list[tuple[int, bytes]] = [(0, b"[\n")]
        size = 2
        self.ends: list[int] = []  # per event: how many pieces must land before it is whole
        for index, event in enumerate(events):
            if index:
                segments.append((size - 1, b"," + event + b"]"))
            else:
                segments[0] = (0, b"[\n" + event + b"]")
            size = segments[-1][0] + len(segments[-1][1])
            self.ends.append(size - 1)  # the byte after the event's "}"
        self.pieces: list[tuple[int, bytes]] = []
        for offset, data in segments:
            bounds = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts[: len(data) // 4])})
            self.pieces += [
                (offset + a, data[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a
            ]
        self.disk = bytearray()
        self.landed = 0

    def step(self, count: int = 1) -> None:
        for _ in range(count):
            if self.landed < len(self.pieces):
                offset, data = self.pieces[self.landed]
                self.disk[offset : offset + len(data)] = data
                self.landed += 1

    def whole_events(self) -> int:
        """How many events have all their bytes on disk."""
        top = max((o + len(d) for o, d in self.pieces[: self.landed]), default=0)
        return sum(1 for end in self.ends if end <= top)


class Recorder:
    """An in-memory stand-in for the rank's ``HubClient``: keeps what it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, record: Record, blob: bytes = b"") -> bool:
        self.sent.append(Message(record, 0, blob))
        return True


def copy_events(path: Path, closed: bool) -> list[Any]:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if not text:
        return []
    return json.loads(text if closed else text + "\n]")


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_event, min_size=1, max_size=12),
    spaced=st.booleans(),
    cuts=st.lists(st.integers(0, 10**6), max_size=40),
    moves=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 40), st.integers(0, 3)), max_size=30),
    killed=st.booleans(),
    data=st.data(),
)
def test_the_notebooks_copy_always_parses_and_holds_the_completed_events(
    events: list[dict[str, Any]],
    spaced: bool,
    cuts: list[int],
    moves: list[tuple[int, int, int]],
    killed: bool,
    data: st.DataObject,
) -> None:
    raw = [serialize(event, spaced) for event in events]
    writer = HorovodWriter(raw, cuts)
    torn: list[tuple[int, int]] = []  # per read: (bytes per system call, pieces landing in between)

    def torn_read(path: str, offset: int) -> bytes:
        size, between = torn.pop() if torn else (1 << 20, 0)
        out = b""
        while chunk := bytes(writer.disk[offset + len(out) : offset + len(out) + size]):
            out += chunk
            writer.step(between)
        return out

    client = Recorder()
    stream = TimelineStream(client, "rank0-timeline.json", read=torn_read)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as folder:
        check_stream(
            events, writer, stream, client, Path(folder) / "timeline.json", moves, torn, killed, data
        )


def check_stream(
    events: list[dict[str, Any]],
    writer: HorovodWriter,
    stream: TimelineStream,
    client: Recorder,
    copy: Path,
    moves: list[tuple[int, int, int]],
    torn: list[tuple[int, int]],
    killed: bool,
    data: st.DataObject,
) -> None:
    files = RankFiles(str(copy), None)
    delivered = 0
    for before, size, between in moves:
        writer.step(before)
        must_have = writer.whole_events()  # whole before this read began: the read must see them
        torn.append((size, between))
        stream.send_new()
        for message in client.sent[delivered:]:
            files.take(message)
        delivered = len(client.sent)
        seen = copy_events(copy, closed=False)
        assert seen == events[: len(seen)]
        assert must_have <= len(seen) <= writer.whole_events()
    if not killed:
        stream.finish(flush=lambda: writer.step(len(writer.pieces)))
    else:
        stream.finish(flush=lambda: writer.step(data.draw(st.integers(0, 3))))
    for message in client.sent[delivered:]:
        files.take(message)
    files.close()  # the run ended: a copy whose last chunk never came is closed all the same
    final = copy_events(copy, closed=True)
    assert final == events[: writer.whole_events()]
    if not killed:
        assert final == events
        assert isinstance(client.sent[-1].record, FileChunk) and client.sent[-1].record.last


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_event, max_size=10),
    spaced=st.booleans(),
    cuts=st.lists(st.integers(0, 10**6), max_size=20),
)
def test_the_cutter_returns_each_whole_event_once_however_the_bytes_are_split(
    events: list[dict[str, Any]], spaced: bool, cuts: list[int]
) -> None:
    text = b"[\n" + b",\n".join(serialize(event, spaced) for event in events) + b"]"
    bounds = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    cutter = EventCutter()
    out = [event for a, b in zip(bounds, bounds[1:], strict=False) for event in cutter.feed(text[a:b])]
    assert [json.loads(event) for event in out] == events
    assert cutter.strays == 0 and cutter.carry == b""


def test_a_stale_bracket_between_events_is_a_separator_not_data() -> None:
    # What one read() returned in the failure that opened this: the old "]", then the next event.
    cutter = EventCutter()
    events = cutter.feed(b'[\n{"ph": "i", "s": "g"}]{"ph": "i", "name": "CYCLE_START", "s": "g"}]')
    assert [json.loads(event)["ph"] for event in events] == ["i", "i"]


WRITE_OUT = """import os, sys, torch
path = sys.argv[1]
os.environ["HOROVOD_TIMELINE"] = path
import horovod.torch as hvd
hvd.init()
for i in range(50):
    hvd.allreduce(torch.ones(10), name=f"t{i}")
from hvd_magic.rank.timeline_stream import _open_here, stop_and_write_out
print("open", _open_here(path), "closed", stop_and_write_out(path), "open", _open_here(path))
hvd.shutdown()
"""


def test_rank_0_waits_for_horovods_writer_to_write_out_its_queue(tmp_path):
    """hvd.shutdown() stops Horovod's timeline writer at once, dropping what it still has queued;
    rank 0 stops the timeline first and waits until the writer has closed the file (a real,
    single-process Horovod)."""
    path = tmp_path / "timeline.json"
    done = subprocess.run(
        [sys.executable, "-c", WRITE_OUT, str(path)], capture_output=True, text=True, timeout=300,
        env=single_process_env(),
    )  # fmt: skip
    assert "open True closed True open False" in done.stdout, done.stdout + done.stderr[-3000:]
    events = json.loads(path.read_text())  # whole: Horovod closed it
    allreduces = [event for event in events if event.get("ph") == "B" and event.get("name") == "ALLREDUCE"]
    assert len(allreduces) == 50  # every tensor's, the last ones included
