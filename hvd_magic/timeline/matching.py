"""Spans from ``B``/``E`` events, and the rank-ready ``X`` marks inside them.

Within one tensor (``pid``) spans nest, so an ``E`` closes the innermost open ``B`` of its
tensor: a stack per tensor, fed the events in file order. An ``E`` with nothing open is stray
and dropped; a ``B`` never closed (a cut-off file) keeps ``end`` ``ABSENT`` and the store drops
it. An ``X`` inside an open span marks a rank as ready (Horovod writes one per rank inside each
``NEGOTIATE_*`` span it does not answer from its response cache): the last one names the rank
the others waited for.

The C matcher (``_match.c``) does this without the GIL at memory speed; :class:`PyMatcher` is
the same in Python, for an install without a C compiler and as the reference in the tests.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["ABSENT", "Matched", "Matcher", "PyMatcher", "matched", "new_matcher"]

ABSENT = np.iinfo(np.int64).min

# start, end, pid, name, depth (one per B, file order); ready_span, ready_name, ready_wait
Matched = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray
]
DTYPES = (np.int64, np.int64, np.int64, np.int32, np.uint8, np.int64, np.int32, np.int64)


class Matcher(Protocol):
    def feed(self, ph: memoryview, name: memoryview, ts: memoryview, pid: memoryview) -> None: ...

    def finish(self) -> tuple[bytes, ...]: ...

    def snapshot(self) -> tuple[bytes, ...]: ...


def new_matcher() -> Matcher:
    try:
        from ._match import Matcher as CMatcher
    except ImportError:
        return PyMatcher()
    matcher: Matcher = CMatcher()
    return matcher


def matched(matcher: Matcher, more: bool = False) -> Matched:
    """The matcher's columns as numpy arrays; with ``more``, the matcher goes on afterwards."""
    raw = matcher.snapshot() if more else matcher.finish()
    columns = [np.frombuffer(column, dtype) for column, dtype in zip(raw, DTYPES, strict=True)]
    return tuple(columns)  # type: ignore[return-value]


class PyMatcher:
    """``_match.Matcher`` in Python: one event at a time."""

    def __init__(self) -> None:
        self.stacks: dict[int, list[list[int]]] = {}  # pid -> [span, last ts, previous ts, last name, marks]
        self.columns: list[list[int]] = [[] for _ in DTYPES]

    def feed(self, ph: memoryview, name: memoryview, ts: memoryview, pid: memoryview) -> None:
        phases = np.frombuffer(ph, np.uint8).tolist()
        names = np.frombuffer(name, np.int32).tolist()
        times = np.frombuffer(ts, np.int64).tolist()
        pids = np.frombuffer(pid, np.int64).tolist()
        start, end, pid_, name_, depth, ready_span, ready_name, ready_wait = self.columns
        for code, label, at, tensor in zip(phases, names, times, pids, strict=True):
            if at == ABSENT:
                continue  # no time: no span, no mark
            stack = self.stacks.setdefault(tensor, [])
            if code == ord("B"):
                stack.append([len(start), ABSENT, ABSENT, -1, 0])
                for column, value in ((start, at), (end, ABSENT), (pid_, tensor), (name_, label)):
                    column.append(value)
                depth.append(min(len(stack) - 1, 255))
            elif code == ord("E") and stack:
                span, last, previous, last_name, marks = stack.pop()
                end[span] = at
                if marks:
                    ready_span.append(span)
                    ready_name.append(last_name)
                    ready_wait.append(last - previous if marks > 1 else 0)
            elif code == ord("X") and stack:
                top = stack[-1]
                top[1:] = [at, top[1], label, top[4] + 1]

    def snapshot(self) -> tuple[bytes, ...]:
        return tuple(np.array(c, dtype).tobytes() for c, dtype in zip(self.columns, DTYPES, strict=True))

    def finish(self) -> tuple[bytes, ...]:
        out = self.snapshot()
        self.columns = [[] for _ in DTYPES]
        self.stacks = {}
        return out
