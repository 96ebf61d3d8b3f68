"""``breakpoint()``, pdb and ``input()`` inside a rank, answered at the notebook.

A rank has no terminal: each line it reads is a ``Prompt`` on its connection to the notebook,
which asks the person there with the kernel's own input box, labelled with the rank and host,
and sends back what was typed (``run.prompts``). pdb writes into a buffer that travels with its
next prompt, so what it printed and its prompt arrive together and in order; the cell's source
is in ``linecache``, so ``l`` shows it. ``HVD_MAGIC_BREAKPOINT_RANKS`` ("1", "0,2", "0:2")
chooses whose breakpoints stop; the others pass them. Where the notebook takes no input (a headless run), the
first breakpoint is passed with one line saying so and later ones silently, and ``input()``
raises EOFError, as Python's does without a stdin: never a hang.
"""

from __future__ import annotations

import builtins
import io
import os
import pdb
import re
import sys
from types import FrameType, TracebackType
from typing import IO, cast

from hvd_magic.protocol import ENV_BREAKPOINT_RANKS, DebuggerLeft, Prompt
from hvd_magic.rank import reporting

__all__ = ["RankPdb", "ask", "failed", "forget", "install", "notebook_input", "post_mortem"]

ANSWER_SECONDS = 7 * 24 * 3600.0  # a person answers when they answer
_closed = False  # the notebook said it takes no input: asked no more
_failure: tuple[BaseException, TracebackType] | None = None  # a live session's last failed cell


def ask(text: str, debugger: bool = False) -> str | None:
    """The line typed at the notebook for ``text`` (its last line the prompt), without its
    newline; None where the notebook takes no input, or outside a run."""
    global _closed
    reporter = reporting.current()
    if reporter is None or _closed:
        return None
    answer = reporter.client.ask(Prompt(0, text, debugger), b"", ANSWER_SECONDS).record
    if getattr(answer, "closed", True):
        _closed = True
        return None
    return str(getattr(answer, "line", ""))


def notebook_input(prompt: object = "") -> str:
    """``input()`` in a rank: asked at the notebook."""
    sys.stdout.flush()  # what the cell printed before, ahead of the question
    line = ask(str(prompt))
    if line is None:
        raise EOFError("hvd_magic: the notebook takes no input (a headless run), so input() has no answer")
    return line


class _NotebookLines:
    """pdb's stdin (all of a file it reads): each line asked at the notebook, with what pdb
    wrote since the last."""

    def __init__(self, written: io.StringIO) -> None:
        self.written = written

    def readline(self) -> str:
        line = ask(_take(self.written), debugger=True)
        if line is None:  # no one to ask: go on, said once
            said = f"hvd_magic: rank {_rank()}: a breakpoint was passed: the notebook takes no input"
            print(said, file=sys.stderr)
            return "continue\n"
        return line + "\n"


def _take(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text


def _rank() -> int:
    reporter = reporting.current()
    return reporter.client.rank if reporter is not None else 0


def _stops_here() -> bool:
    chosen = os.environ.get(ENV_BREAKPOINT_RANKS, "").strip()
    if _closed or reporting.current() is None:
        return False
    return not chosen or str(_rank()) in re.findall(r"\d+", chosen)  # "1", "0,2", "0:2" (in env=)


class RankPdb(pdb.Pdb):
    """pdb whose prompts are the notebook's (``pdb.Pdb`` in a rank, so ``breakpoint()``,
    ``pdb.set_trace()`` and ``pdb.post_mortem()`` all get it)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.written = io.StringIO()
        lines = cast(IO[str], _NotebookLines(self.written))
        super().__init__(stdin=lines, stdout=self.written, nosigint=True, readrc=False)
        self.use_rawinput = False

    def set_trace(self, frame: FrameType | None = None) -> None:
        if _stops_here():
            super().set_trace(frame or sys._getframe().f_back)

    def set_continue(self) -> None:
        super().set_continue()
        self._left()

    def set_quit(self) -> None:
        super().set_quit()
        self._left()

    def _left(self) -> None:
        reporter = reporting.current()
        if reporter is not None:
            reporter.client.send(DebuggerLeft(_take(self.written)))


def install() -> None:
    """In a rank, before the user's code: its questions go to the notebook."""
    builtins.input = notebook_input
    pdb.Pdb = RankPdb  # type: ignore[misc]


def failed(error: BaseException, traceback: TracebackType | None) -> None:
    """A cell failed here: kept for ``post_mortem`` (``traceback`` from the user's first frame)."""
    global _failure
    _failure = (error, traceback) if traceback is not None else None


def forget() -> None:
    """A new cell: the last failure's frames (and the memory they hold) are let go."""
    global _failure
    _failure = None


def post_mortem() -> str:
    """``%horovod debug``: pdb at the frame where this rank's last cell failed, its locals as
    they were; what to say instead when there is none."""
    if _failure is None:
        return f"rank {_rank()}: its last cell did not fail here, so there is nothing to debug"
    error, traceback = _failure
    debugger = RankPdb()
    debugger.reset()
    debugger.message(f"{type(error).__name__}: {error}")
    debugger.interaction(None, traceback)
    return ""
