"""TensorFlow's C++ log level, kept in a rank's output (pure).

In a notebook, TensorFlow's C++ log lines go to the Jupyter server's terminal, never into the
cell. In a rank, fd 2 is the cell's log, so they would show up there. Ranks therefore get
``TF_CPP_MIN_LOG_LEVEL=1`` (warnings and errors only) unless the user sets it. TensorFlow
ignores that level for what it logs before absl's logging is set up (its oneDNN notice on
import, and absl's warning that such lines go to stderr), so this filter drops those lines
when their severity is below the level, and keeps everything else byte for byte.
"""

from __future__ import annotations

import re

__all__ = ["TfLogFilter", "min_level"]


# absl's prefix, piece by piece: severity letter, mmdd, time, thread id, file:line] (as in
# "I0000 00:00:17… 605 port.cc:153] oneDNN custom operations are on …").
_PIECES = [
    ("[IWEF]", 1, "1"),
    (r"\d", 4, "4"),
    (" ", 1, "1"),
    (r"\d", 2, "2"),
    (":", 1, "1"),
    (r"\d", 2, "2"),
    (":", 1, "1"),
    (r"[\d.]", 1, ""),
    (" ", 1, ""),
    (r"\d", 1, ""),
    (" ", 1, "1"),
    (r"[\w./-]", 1, ""),
    (":", 1, "1"),
    (r"\d", 1, ""),
    (r"\]", 1, "1"),
    (" ", 1, "1"),
]
_ABSL_LINE = re.compile(
    ("^(?P<severity>[IWEF])" + "".join(f"{c}{{{lo},{hi}}}" for c, lo, hi in _PIECES[1:])).encode()
)


def _partial_pattern() -> re.Pattern[bytes]:
    """Text that is the start of absl's prefix, or holds all of it."""
    pattern = ".*"
    for piece, lo, hi in reversed(_PIECES):
        pattern = f"{piece}{{0,{hi}}}|{piece}{{{lo},{hi}}}(?:{pattern})"
    return re.compile(pattern.encode(), re.S)


_MAY_BE_ABSL = _partial_pattern()
_PRE_INIT_WARNING = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}


def min_level(value: str | None) -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it (0 when unset or not a number)."""
    try:
        return int(value or 0)
    except ValueError:
        return 0


class TfLogFilter:
    """Feed it a rank's stderr; it holds back a partial line only while it may still be one to drop."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._tail = b""

    def feed(self, data: bytes) -> bytes:
        if self.level <= 0:
            return data
        *lines, tail = (self._tail + data).split(b"\n")
        kept = b"".join(line + b"\n" for line in lines if not self._drops(line))
        self._tail = tail if self._may_drop(tail) else b""
        return kept if self._tail else kept + tail

    def flush(self) -> bytes:
        """What is still held back (the stream ended)."""
        tail, self._tail = self._tail, b""
        return b"" if self._drops(tail) else tail

    def _drops(self, line: bytes) -> bool:
        if line.rstrip(b"\r") == _PRE_INIT_WARNING:
            return True
        found = _ABSL_LINE.match(line)
        return found is not None and _SEVERITY[found["severity"]] < self.level

    def _may_drop(self, tail: bytes) -> bool:
        """Whether a line that starts so may still be one to drop (then it waits for its end)."""
        if _PRE_INIT_WARNING.startswith(tail):
            return True
        if _ABSL_LINE.match(tail):
            return self._drops(tail)
        return _MAY_BE_ABSL.fullmatch(tail) is not None
