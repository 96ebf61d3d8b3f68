"""Where this rank is, at any moment: its threads' Python stacks, taken on the inbox's thread
while the cell runs (``%horovod stacks``, and the notebook's own asking at a stall or a
timeout). The main thread's frames start at the cell's first one (hvd_magic's own frames that
run it are left out, and runpy's that run the worker as ``python -m`` or a fork server does);
the user's other threads are folded to their innermost frame; hvd_magic's own threads are
left out."""

from __future__ import annotations

import runpy
import sys
import threading
import traceback
from pathlib import Path
from types import FrameType

from hvd_magic.protocol import RankStacks

__all__ = ["snapshot"]

OWN_THREAD_PREFIX = "hvd_magic-"  # every thread hvd_magic starts in a rank is named so
PACKAGE = str(Path(__file__).resolve().parents[1]) + "/"
RUNPY = {"<frozen runpy>", runpy.__file__}  # what runs the worker as __main__


def _frames(frame: FrameType) -> list[list[str | int]]:
    frames: list[list[str | int]] = [
        [entry.filename, entry.lineno or 0, entry.name, (entry.line or "").strip()]
        for entry in traceback.extract_stack(frame)  # outermost first
    ]
    # From the first frame of the user's code: the first after hvd_magic's own that run it.
    first = next((i for i in range(1, len(frames)) if _ours(frames[i - 1]) and not _ours(frames[i])), 0)
    return frames[first:]


def _ours(frame: list[str | int]) -> bool:
    return str(frame[0]).startswith(PACKAGE) or frame[0] in RUNPY


def _innermost(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})"


def snapshot(asked: int, in_cell: bool = True) -> RankStacks:
    """This process's stacks now; ``in_cell`` False: a live session's rank between cells."""
    frames = sys._current_frames()
    main_id = threading.main_thread().ident
    others = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if thread.ident == main_id or frame is None or thread.name.startswith(OWN_THREAD_PREFIX):
            continue
        others.append([thread.name, _innermost(frame)])
    main = frames.get(main_id or -1)
    if main is None or not in_cell:
        return RankStacks(asked, others=others, idle=not in_cell)
    return RankStacks(asked, main=_frames(main), others=others)
