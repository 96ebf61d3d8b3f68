"""Stalls: ranks waiting in a collective for others that never reach it.

Horovod's are told by Horovod: its warnings, picked out of a rank's stderr as it is written
(pure).

While some ranks wait on a tensor that others never submitted, Horovod's coordinator (rank 0)
prints every ``HOROVOD_STALL_CHECK_TIME_SECONDS``::

    [2026-11-22 23:58:30.723583: W .../stall_inspector.cc:107] One or more tensors were
    submitted ... for more than 2 seconds. This may indicate ...
    Missing ranks:
    0: [allreduce.t3]

``StallFilter.feed`` takes stderr bytes and returns what to show as it is, and the stalls found:
the warning's lines are held back, since the views show a stall their own way.

torch.distributed tells nothing until its timeout (30 min by default), and then not who was
behind. So each torch rank runs a ``WaitWatch``: it samples the main thread's stack and tells the
hub (``Waiting``) once the rank has been inside one torch.distributed call, or a backward pass
(where DDP waits for the gradients' allreduce), for a couple of seconds, and again when it came
out. The notebook's ``run.stalls.waiting_stall`` turns the waits into a ``Stall``.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import types
from collections.abc import Callable

from hvd_magic.protocol import CELL_FILENAME, Record, Stall, Waiting

__all__ = ["StallFilter", "WaitWatch", "waiting_in"]

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


def waiting_in(frame: types.FrameType | None) -> tuple[types.FrameType, str, str] | None:
    """Whether the stack ending in ``frame`` waits in torch.distributed: the outermost frame of
    the call (its identity tells one wait from the next), the call's name and where it was
    called from ("line 12 of the cell", "train.py:40"); None when it does not."""
    torch = sys.modules.get("torch")
    if torch is None or frame is None or not getattr(torch, "__file__", None):
        return None
    torch_dir = os.path.dirname(str(torch.__file__)) + os.sep
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    stack.reverse()  # outermost first
    for index, candidate in enumerate(stack):
        call = _torch_call(candidate.f_code, torch_dir)
        if call is not None:
            return candidate, call, _caller(stack[:index], torch_dir)
    return None


def _torch_call(code: types.CodeType, torch_dir: str) -> str | None:
    path, name = code.co_filename, code.co_name
    public = not name.startswith(("_", "<"))  # not a helper, nor a module being imported, a lambda
    if path.startswith(torch_dir + "distributed" + os.sep) and public and name != "wrapper":
        return name  # init_process_group, all_reduce, barrier, ...
    if name == "backward" and path.startswith(torch_dir) and _initialized():
        return "backward"  # DDP: waits for the gradients' allreduce
    return None


def _initialized() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _caller(outer: list[types.FrameType], torch_dir: str) -> str:
    """The user's line that made the call: the cell's, else the innermost outside torch."""
    for frame in reversed(outer):
        if frame.f_code.co_filename == CELL_FILENAME:
            return f"line {frame.f_lineno} of the cell"
    for frame in reversed(outer):
        if not frame.f_code.co_filename.startswith(torch_dir):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return ""


class WaitWatch:
    """Samples the main thread of a torch.distributed rank every ``interval`` seconds; sends
    ``Waiting`` once one call has lasted ``report_after`` seconds, and an empty one when it ended."""

    def __init__(
        self,
        send: Callable[[Record], object],
        interval: float = 0.5,
        report_after: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.send, self.interval, self.report_after, self.clock = send, interval, report_after, clock
        self._anchor: types.FrameType | None = None
        self._since = 0.0
        self._reported = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hvd_magic-wait-watch", daemon=True)
        self._main = threading.main_thread().ident

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._anchor = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample(sys._current_frames().get(self._main or 0))

    def sample(self, frame: types.FrameType | None) -> None:
        found = waiting_in(frame)
        now = self.clock()
        if found is None or found[0] is not self._anchor:
            if self._reported:
                self.send(Waiting())
            self._anchor, self._since, self._reported = (found[0] if found else None), now, False
        elif not self._reported and now - self._since >= self.report_after:
            self.send(Waiting(found[1], found[2], now - self._since))
            self._reported = True
