"""A rank's output as a terminal would show it (pure): ``\\r`` rewinds the line (tqdm, Keras
``verbose=1``), ANSI colours are dropped, the last lines kept."""

from __future__ import annotations

import re

__all__ = ["MAX_LINE", "MAX_LOG_LINES", "TerminalLog"]

MAX_LOG_LINES = 2000
MAX_LINE = 10_000  # characters of a line never ended (progress dots): its end is kept
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class TerminalLog:
    """Text as a terminal would show it."""

    def __init__(self, limit: int = MAX_LOG_LINES) -> None:
        self.limit = limit
        self.lines: list[str] = []
        self.current = ""
        self._cursor = 0
        self.committed = 0  # lines ever completed, including those dropped from the front

    def feed(self, text: str) -> None:
        for piece in re.split(r"(\r\n|\r|\n)", _ANSI.sub("", text)):
            if piece in ("\n", "\r\n"):
                self._commit()
            elif piece == "\r":
                self._cursor = 0
            elif piece:
                line = self.current
                self.current = line[: self._cursor] + piece + line[self._cursor + len(piece) :]
                self._cursor += len(piece)
                if len(self.current) > MAX_LINE:  # copied at every feed, drawn at every redraw
                    self._cursor -= len(self.current) - MAX_LINE
                    self.current = self.current[-MAX_LINE:]

    def _commit(self) -> None:
        self.lines.append(self.current)
        self.committed += 1
        self.current, self._cursor = "", 0
        if len(self.lines) > self.limit:
            del self.lines[: len(self.lines) - self.limit]

    def text(self) -> str:
        return "\n".join(self.lines + ([self.current] if self.current else []))
