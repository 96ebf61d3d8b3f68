"""Where a run's messages go: widgets in a Jupyter kernel, text lines elsewhere."""

from __future__ import annotations

import sys
from typing import Protocol

from .protocol import Log, LogDecoder, Message

__all__ = ["ConsoleView", "RunView", "make_view"]


class RunView(Protocol):
    """What the engine feeds: notices, every rank message, a tick after each batch, close."""

    def notice(self, text: str) -> None: ...

    def message(self, message: Message) -> None: ...

    def tick(self) -> None:
        """Called after each batch of messages: a view may redraw here (throttled)."""

    def close(self) -> None: ...


class ConsoleView:
    """Prints rank output as it arrives, each line tagged with its rank: ``[1] text``."""

    def __init__(self) -> None:
        self._at_line_start: dict[tuple[int, str], bool] = {}
        self._decoder = LogDecoder()

    def notice(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def message(self, message: Message) -> None:
        if not isinstance(message.record, Log):
            return
        stream = message.record.stream
        out = sys.stderr if stream == "stderr" else sys.stdout
        key = (message.rank, stream)
        pieces = []
        for line in self._decoder.text(message).splitlines(keepends=True):
            if self._at_line_start.get(key, True):
                pieces.append(f"[{message.rank}] ")
            pieces.append(line)
            self._at_line_start[key] = line.endswith("\n")
        out.write("".join(pieces))
        out.flush()

    def tick(self) -> None:
        pass

    def close(self) -> None:
        for (_rank, stream), at_start in self._at_line_start.items():
            if not at_start:
                (sys.stderr if stream == "stderr" else sys.stdout).write("\n")


def make_view(ranks: int) -> RunView:
    """Live widgets in a Jupyter kernel (when ipywidgets and plotly are installed), else text."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
            from .widgets.view import LiveView

            return LiveView(ranks)
    except ImportError:
        pass
    return ConsoleView()
