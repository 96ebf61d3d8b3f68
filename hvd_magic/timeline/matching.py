"""Spans from ``B``/``E`` events, and the rank-ready ``X`` marks inside them.

Within one tensor (``pid``) spans nest, so an ``E`` closes the innermost open ``B`` of its
tensor: a stack per tensor, fed the events in file order. An ``E`` with nothing open is stray
and dropped; a ``B`` never closed (a cut-off file) is left out. An ``X`` inside an open span
marks a rank as ready (Horovod writes one per rank inside each ``NEGOTIATE_*`` span it does not
answer from its response cache): the last one names the rank the others waited for.

The matcher keeps each tensor's spans apart as it goes, so they come out grouped by tensor, in
the order asked, without a sort: a timeline's spans are held about once, in the form the store
keeps them (durations in 32 bits where they fit).

The C matcher (``_match.c``) does this without the GIL at memory speed; :class:`PyMatcher` is
the same in Python, for an install without a C compiler and as the reference in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["ABSENT", "Matched", "Matcher", "PyMatcher", "matched", "new_matcher", "release_memory", "tensors"]

ABSENT = np.iinfo(np.int64).min
NARROW = np.iinfo(np.uint32).max  # the longest duration a uint32 column holds


@dataclass
class Matched:
    """The closed spans of the tensors asked for, one tensor after another, each tensor's in file
    order; ``ready_*``: one entry per span that had rank-ready marks (``ready_span`` indexes the
    spans)."""

    start: np.ndarray  # int64
    duration: np.ndarray  # uint32, or int64 when one does not fit
    name: np.ndarray  # int32 name ids
    depth: np.ndarray  # uint8
    in_order: bool  # each tensor's spans come by start
    ready_span: np.ndarray  # int64
    ready_name: np.ndarray  # int32: the name of the last mark (the rank ready last)
    ready_wait: np.ndarray  # int64: how long the others had waited for it


class Matcher(Protocol):
    def feed(self, ph: memoryview, name: memoryview, ts: memoryview, pid: memoryview) -> None: ...

    def tensors(self) -> tuple[bytes, bytes]: ...

    def finish(self, order: bytes) -> tuple[bytes, bytes, bytes, bytes, bool, bytes, bytes, bytes]: ...

    def snapshot(self, order: bytes) -> tuple[bytes, bytes, bytes, bytes, bool, bytes, bytes, bytes]: ...


def new_matcher() -> Matcher:
    try:
        from hvd_magic.timeline._match import Matcher as CMatcher
    except ImportError:
        return PyMatcher()
    matcher: Matcher = CMatcher()
    return matcher


def release_memory() -> None:
    """Gives the heap's free pages back to the system after a large job: glibc keeps what numpy
    freed where live blocks pin it (``_match.trim``; without the C matcher, nothing)."""
    try:
        from hvd_magic.timeline._match import trim
    except ImportError:
        return
    trim()


def tensors(matcher: Matcher) -> tuple[np.ndarray, np.ndarray]:
    """(pid, closed spans) of each tensor seen, by first appearance (the matcher's indices)."""
    pids, closed = matcher.tensors()
    return np.frombuffer(pids, np.int64), np.frombuffer(closed, np.int64)


def matched(matcher: Matcher, order: np.ndarray, more: bool = False) -> Matched:
    """The closed spans of the tensors at ``order`` (indices as :func:`tensors` gives them);
    with ``more`` the matcher goes on afterwards, else it starts over."""
    chosen = np.ascontiguousarray(order, np.int32).tobytes()
    start, duration, name, depth, in_order, span, ready_name, wait = (
        matcher.snapshot(chosen) if more else matcher.finish(chosen)
    )
    count = len(start) // 8
    return Matched(
        start=np.frombuffer(start, np.int64),
        duration=np.frombuffer(duration, np.uint32 if len(duration) == 4 * count else np.int64),
        name=np.frombuffer(name, np.int32),
        depth=np.frombuffer(depth, np.uint8),
        in_order=bool(in_order),
        ready_span=np.frombuffer(span, np.int64),
        ready_name=np.frombuffer(ready_name, np.int32),
        ready_wait=np.frombuffer(wait, np.int64),
    )


class PyMatcher:
    """``_match.Matcher`` in Python: one event at a time."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}  # pid -> tensor index
        self.spans: list[list[list[int]]] = []  # per tensor: [start, end, name, depth] per span
        self.stacks: list[list[list[int]]] = []  # per tensor: [local, last ts, previous ts, name, marks]
        self.ready: list[tuple[int, int, int, int]] = []  # (tensor, local, name, wait)

    def feed(self, ph: memoryview, name: memoryview, ts: memoryview, pid: memoryview) -> None:
        phases = np.frombuffer(ph, np.uint8).tolist()
        names = np.frombuffer(name, np.int32).tolist()
        times = np.frombuffer(ts, np.int64).tolist()
        pids = np.frombuffer(pid, np.int64).tolist()
        for code, label, at, tensor in zip(phases, names, times, pids, strict=True):
            if code not in b"BEX" or at == ABSENT:
                continue  # no time: no span, no mark
            t = self.index.setdefault(tensor, len(self.index))
            if t == len(self.spans):
                self.spans.append([])
                self.stacks.append([])
            spans, stack = self.spans[t], self.stacks[t]
            if code == ord("B"):
                stack.append([len(spans), ABSENT, ABSENT, -1, 0])
                spans.append([at, ABSENT, label, min(len(stack) - 1, 255)])
            elif code == ord("E") and stack:
                local, last, previous, last_name, marks = stack.pop()
                spans[local][1] = at
                if marks:
                    self.ready.append((t, local, last_name, last - previous if marks > 1 else 0))
            elif code == ord("X") and stack:
                top = stack[-1]
                top[1:] = [at, top[1], label, top[4] + 1]

    def tensors(self) -> tuple[bytes, bytes]:
        closed = [sum(span[1] != ABSENT for span in spans) for spans in self.spans]
        return np.array(list(self.index), np.int64).tobytes(), np.array(closed, np.int64).tobytes()

    def snapshot(self, order: bytes) -> tuple[bytes, bytes, bytes, bytes, bool, bytes, bytes, bytes]:
        chosen = np.frombuffer(order, np.int32).tolist()
        if len(set(chosen)) < len(chosen) or not all(0 <= t < len(self.spans) for t in chosen):
            raise ValueError("order: int32 tensor indices, each at most once")
        placed: dict[tuple[int, int], int] = {}  # (tensor, local) -> index in the output
        rows: list[list[int]] = []
        in_order = True
        for t in chosen:
            previous = ABSENT
            for local, span in enumerate(self.spans[t]):
                if span[1] != ABSENT:
                    placed[t, local] = len(rows)
                    rows.append(span)
                    in_order &= span[0] >= previous
                    previous = span[0]
        ready = [
            (placed[t, local], name, wait) for t, local, name, wait in self.ready if (t, local) in placed
        ]
        narrow = all(0 <= e - s <= NARROW for spans in self.spans for s, e, _, _ in spans if e != ABSENT)
        start, end, name, depth = zip(*rows, strict=True) if rows else ((), (), (), ())
        span, ready_name, wait = zip(*ready, strict=True) if ready else ((), (), ())
        duration = np.array(end, np.int64) - np.array(start, np.int64)
        return (
            np.array(start, np.int64).tobytes(),
            duration.astype(np.uint32 if narrow else np.int64).tobytes(),
            np.array(name, np.int32).tobytes(),
            np.array(depth, np.uint8).tobytes(),
            in_order,
            np.array(span, np.int64).tobytes(),
            np.array(ready_name, np.int32).tobytes(),
            np.array(wait, np.int64).tobytes(),
        )

    def finish(self, order: bytes) -> tuple[bytes, bytes, bytes, bytes, bool, bytes, bytes, bytes]:
        out = self.snapshot(order)
        self.index, self.spans, self.stacks, self.ready = {}, [], [], []
        return out
