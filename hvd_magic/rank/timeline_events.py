"""Whole events out of a Horovod Timeline that is still being written.

Horovod keeps its file valid JSON after every event: it ends each one with ``}]`` and, before
the next, seeks back one byte and writes ``,`` over that provisional ``]``. A reader of the
growing file can therefore meet a ``]`` that is not the end, and a single ``read()`` (several
system calls) can even return that stale ``]`` followed by the next event's bytes. Every other
byte is written once. So a stream that keeps only whole top-level objects, and treats ``[``,
``]``, ``,`` and white space between them as separators, holds exactly the events Horovod
completed, whatever the timing of its flushes and our reads.

:class:`EventCutter` does that incrementally: ``feed(bytes)`` returns the events completed by
those bytes and carries an unfinished one over to the next call. Strings (with escapes) are
respected, so a ``}`` inside an ``args`` value never ends an event.
"""

from __future__ import annotations

import re

__all__ = ["EventCutter"]

_STRING = rb'"(?:[^"\\]|\\.)*"'
# Objects nested up to two levels (Horovod's events: ``args`` inside the event), matched by the
# regex engine in one step; anything deeper takes the general scan below.
_INNER = rb"\{(?:[^{}\"]|" + _STRING + rb")*\}"
_EVENT = re.compile(rb"\{(?:[^{}\"]|" + _STRING + rb"|" + _INNER + rb")*\}", re.S)
_SEPARATORS = re.compile(rb"[\s,\[\]]*")
_STRUCTURE = re.compile(rb'[{}"]')
_STRING_END = re.compile(rb'["\\]')


def _object_end(data: bytes, start: int) -> int | None:
    """The offset just past the object that opens at ``start``, or None if it is not whole yet."""
    depth, position = 0, start
    while (found := _STRUCTURE.search(data, position)) is not None:
        char, position = found.group(), found.end()
        if char == b'"':
            while True:  # to the string's closing quote, stepping over escapes
                end = _STRING_END.search(data, position)
                if end is None:
                    return None
                if end.group() == b"\\":
                    position = end.end() + 1
                    continue
                position = end.end()
                break
        elif char == b"{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return position
    return None


class EventCutter:
    """Cuts a byte stream of a JSON array of objects into whole objects.

    >>> cutter = EventCutter()
    >>> cutter.feed(b'[\\n{"ph": "i", "args": {"x": "}"}}]')
    [b'{"ph": "i", "args": {"x": "}"}}']
    >>> cutter.feed(b',{"ph": ')   # the "]" above was provisional; this event is not whole yet
    []
    """

    def __init__(self) -> None:
        self.carry = b""
        self.strays = 0  # bytes between events that are no separator (not Horovod's output)

    def feed(self, data: bytes) -> list[bytes]:
        data = self.carry + data if self.carry else data
        events: list[bytes] = []
        position = 0
        while True:
            position = _SEPARATORS.match(data, position).end()  # type: ignore[union-attr]
            if position >= len(data):
                self.carry = b""
                return events
            if data[position] != ord("{"):
                self.strays += 1
                position += 1
                continue
            match = _EVENT.match(data, position)
            end = match.end() if match is not None else _object_end(data, position)
            if end is None:
                self.carry = data[position:]
                return events
            events.append(data[position:end])
            position = end
