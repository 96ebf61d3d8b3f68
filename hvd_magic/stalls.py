"""Horovod's stall warnings, picked out of a rank's stderr as it is written (pure).

While some ranks wait on a tensor that others never submitted, Horovod's coordinator (rank 0)
prints every ``HOROVOD_STALL_CHECK_TIME_SECONDS``::

    [2026-11-22 23:58:30.723583: W .../stall_inspector.cc:107] One or more tensors were
    submitted ... for more than 2 seconds. This may indicate ...
    Missing ranks:
    0: [allreduce.t3]

``StallFilter.feed`` takes stderr bytes and returns what to show as it is, and the stalls found:
the warning's lines are held back, since the views show a stall their own way.
"""

from __future__ import annotations

import re

from .protocol import Stall

__all__ = ["StallFilter"]

# Horovod's log lines: "[2026-11-23 00:35:13. 41253: W " (microseconds padded with spaces).
_PREFIX = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.[ \d]+: [A-Z] ")
_DATE_SHAPE = b"[dddd-dd-dd dd:dd:dd."
_AFTER_DATE = re.compile(rb"[ \d]*(:( ([A-Z]( .*)?)?)?)?")
_WARNING = re.compile(rb"stall_inspector\.cc:\d+\] .* for more than (\d+) seconds")
_MISSING_HEADER = b"Missing ranks:"
_MISSING = re.compile(rb"(\d+): \[(.*)\]")
_MISSING_PART = re.compile(rb"\d+(:( (\[.*)?)?)?")


class StallFilter:
    """Feed it a rank's stderr; it keeps a line back only while it may still be a stall warning."""

    def __init__(self) -> None:
        self._tail = b""
        self._in_warning = False
        self._threshold = 0.0
        self._missing: dict[int, list[str]] = {}

    def feed(self, data: bytes) -> tuple[bytes, list[Stall]]:
        *lines, tail = (self._tail + data).split(b"\n")
        shown = bytearray()
        stalls: list[Stall] = []
        for line in lines:
            if not self._take(line, stalls):
                shown += line + b"\n"
        if self._may_belong(tail):
            self._tail = tail
        else:
            self._tail = b""
            shown += tail
        return bytes(shown), stalls

    def flush(self) -> bytes:
        """What is still held back (the stream ended)."""
        tail, self._tail = self._tail, b""
        return tail

    def _take(self, line: bytes, stalls: list[Stall]) -> bool:
        """Whether ``line`` is part of a stall warning (then it is consumed)."""
        warning = _WARNING.search(line) if _PREFIX.match(line) else None
        if warning is not None:
            self._in_warning, self._threshold, self._missing = True, float(warning[1]), {}
            return True
        if self._in_warning and line.strip() == _MISSING_HEADER:
            return True
        missing = _MISSING.fullmatch(line.strip()) if self._in_warning else None
        if missing is None:
            self._in_warning = False
            return False
        tensors = [t.strip() for t in missing[2].decode("utf-8", "replace").split(",") if t.strip()]
        self._missing[int(missing[1])] = tensors
        ranks = sorted(self._missing)
        stalls.append(Stall(ranks, [self._missing[r] for r in ranks], self._threshold))
        return True

    def _may_belong(self, tail: bytes) -> bool:
        if not tail:
            return False
        stripped = tail.lstrip()
        if self._in_warning and (_MISSING_HEADER.startswith(stripped) or _MISSING_PART.fullmatch(stripped)):
            return True
        # Held while it may still become one of Horovod's log lines, then to the line's end.
        shape = re.sub(rb"\d", b"d", tail[: len(_DATE_SHAPE)])
        return _DATE_SHAPE.startswith(shape) and _AFTER_DATE.fullmatch(tail[len(_DATE_SHAPE) :]) is not None
