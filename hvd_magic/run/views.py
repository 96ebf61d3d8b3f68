"""Where a run's messages go: widgets in a Jupyter kernel, text lines elsewhere."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Protocol, TextIO

from hvd_magic.protocol import Log, LogDecoder, Message, Stall, Straggler, TimingOff

__all__ = ["ConsoleView", "RunView", "make_view", "timeline_notice", "warm_view"]


class RunView(Protocol):
    """What a run's supervision feeds: notices, every rank message, a tick after each batch, close."""

    def notice(self, text: str) -> None: ...

    def message(self, message: Message) -> None: ...

    def tick(self) -> None:
        """Called after each batch of messages: a view may redraw here (throttled)."""

    def close(self) -> None: ...


class ConsoleView:
    """Prints rank output as it arrives, each line tagged with its rank: ``[1] text``.

    A line still open when another rank writes to the same stream is ended there, and its
    rest comes later tagged again, so no line ever mixes two ranks' text.
    """

    def __init__(self) -> None:
        self._open: dict[str, int | None] = {"stdout": None, "stderr": None}  # stream -> rank mid-line
        self._decoder = LogDecoder()
        self._stall: Stall | None = None
        self._timing_off = False  # said: a rank's wait timing cost too much (once, whichever rank)

    def notice(self, text: str) -> None:
        self._end_open_line("stderr")
        print(text, file=sys.stderr, flush=True)

    def message(self, message: Message) -> None:
        if isinstance(message.record, Stall):
            self._stalled(message.record)
        if isinstance(message.record, Straggler):
            self.notice(f"hvd_magic: {message.record.text()}")
        if isinstance(message.record, TimingOff) and not self._timing_off:
            self._timing_off = True
            self.notice(f"hvd_magic: {message.record.text(message.rank)}")
        if not isinstance(message.record, Log):
            return
        stream, rank = message.record.stream, message.rank
        if self._open.get(stream) not in (None, rank):
            self._end_open_line(stream)
        pieces = []
        for line in self._decoder.text(message).splitlines(keepends=True):
            if self._open.get(stream) is None:
                pieces.append(f"[{rank}] ")
            pieces.append(line)
            self._open[stream] = None if line.endswith("\n") else rank
        out = _out(stream)
        out.write("".join(pieces))
        out.flush()

    def _stalled(self, stall: Stall) -> None:
        """One line per new stall (Horovod repeats its warning every check interval)."""
        if stall != self._stall:
            self._stall = stall
            self.notice(f"hvd_magic: stalled for over {stall.threshold:g} s: {stall.missing()}")

    def _end_open_line(self, stream: str) -> None:
        if self._open.get(stream) is not None:
            _out(stream).write("\n")
            self._open[stream] = None

    def tick(self) -> None:
        pass

    def close(self) -> None:
        for stream in self._open:
            self._end_open_line(stream)


def _out(stream: str) -> TextIO:
    return sys.stderr if stream == "stderr" else sys.stdout


def make_view(ranks: int) -> RunView:
    """Live widgets in a Jupyter kernel (when ipywidgets and plotly are installed), else text."""
    if _in_kernel():
        if _warming:  # its imports, not another thread's beside them (a module half imported)
            _warming[0].join()
        with contextlib.suppress(ImportError):
            from hvd_magic.widgets.live_view import LiveView

            return LiveView(ranks)
    return ConsoleView()


def warm_view() -> None:
    """In a Jupyter kernel, the live view's imports made now, on a thread, while the notebook
    waits for its next cell (``%load_ext``): plotly's ``FigureWidget`` brings nbformat and
    jsonschema, whose URI grammar is compiled on import, 1.6 s of a first cell's 2.7 s. A cell
    that comes sooner waits for the same imports (Python's import lock), as it did before."""
    if _in_kernel() and not _warming:
        _warming.append(threading.Thread(target=_import_view, name="hvd_magic-warm-view", daemon=True))
        _warming[0].start()


_warming: list[threading.Thread] = []  # warm_view's, once a kernel


def _import_view() -> None:
    with contextlib.suppress(Exception):  # a warm-up only: the first cell meets any error itself
        import plotly.graph_objects as go

        import hvd_magic.widgets.live_view  # noqa: F401 - imported for what it imports

        go.FigureWidget  # noqa: B018 - plotly makes the class, and imports its needs, on first use


def _in_kernel() -> bool:
    with contextlib.suppress(ImportError):
        from IPython import get_ipython

        return type(get_ipython()).__name__ == "ZMQInteractiveShell"
    return False


def timeline_notice(path: str | None) -> list[str]:
    """What a run recording a timeline says first."""
    if not path:
        return []
    return [
        f"timeline on, written to {path}: recording it slows training (HorovodRunner's docs measured "
        "~40 % for Inception3)"
    ]
