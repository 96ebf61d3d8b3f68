"""What a live session's ranks are told and what it keeps of each: the set-up cell they run
once, how often they hear a beat, how long a silence they wait for before leaving."""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from hvd_magic.launch import Launcher
from hvd_magic.options import RunOptions
from hvd_magic.protocol import SILENT_EXIT, RankStatus, Started
from hvd_magic.run.supervisor import BEAT_SECONDS

__all__ = [
    "BEATS_PER_SILENCE",
    "SILENCE_SECONDS",
    "RankInfo",
    "beat_interval",
    "ended",
    "hosts_and_pids",
    "panel_row",
    "setup_imports",
    "setup_source",
]

# A rank that hears no beat for this long exits: the notebook (its kernel) is gone.
SILENCE_SECONDS = float(os.environ.get("HVD_MAGIC_SESSION_SILENCE", "20"))
# A short silence limit beats faster: ranks leave only after this many beats were missed (a
# busy notebook's beat comes late, and two late beats must not end a session).
BEATS_PER_SILENCE = 8


def beat_interval() -> float:
    """Seconds between a session's beats: one a second, more often under a short limit."""
    return min(BEAT_SECONDS, SILENCE_SECONDS / BEATS_PER_SILENCE)


def setup_source(options: RunOptions) -> str:
    """The set-up cell every rank runs once: the framework's init, ``hvd`` or ``dist`` kept."""
    if options.launcher == "torch":
        return (
            "import torch, torch.distributed as dist\n"
            "dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')\n"
        )
    return (
        "try:\n    import horovod.torch as hvd\nexcept ImportError:\n"
        "    import horovod.tensorflow as hvd\nhvd.init()\n"
    )


def setup_imports(options: RunOptions) -> frozenset[str]:
    """What the set-up cell will import, for ``warm.choice``: torch.distributed with
    ``backend=torch``; else Horovod's PyTorch binding where it is installed here (it is the one
    tried first), or its TensorFlow binding."""
    if options.launcher == "torch":
        return frozenset({"torch", "torch.distributed"})
    if not importlib.util.find_spec("horovod"):
        return frozenset()
    if importlib.util.find_spec("torch"):
        return frozenset({"torch", "horovod.torch"})
    tensorflow = importlib.util.find_spec("tensorflow")
    return frozenset({"tensorflow", "horovod.tensorflow"}) if tensorflow else frozenset()


@dataclass
class RankInfo:
    started: Started | None = None
    inbox: bytes = b""  # the rank's receiving connection (from its first RankStatus)
    status: RankStatus | None = None
    answers: int = 0  # RankStatus messages so far


def hosts_and_pids(ranks: dict[int, RankInfo]) -> tuple[dict[int, str], dict[int, int]]:
    """Each started rank's host and process id (what ``run.stacks`` names them by)."""
    started = {rank: info.started for rank, info in ranks.items() if info.started is not None}
    return {rank: s.host for rank, s in started.items()}, {rank: s.pid for rank, s in started.items()}


def panel_row(session: Any) -> dict[str, Any]:
    """What the Horovod panel lists of a live session (read from the endpoint's thread: copies)."""
    infos = list(session.ranks.values())
    hosts = sorted({info.started.host for info in infos if info.started is not None})
    seen = [info.status for info in infos if info.status is not None]
    spread = "local" if session.options.np < 0 else "on Spark"
    return {
        "where": f"live session, {session.size} ranks {spread}",
        "ranks": session.size,
        "hosts": hosts,
        "state": "running a cell" if session.running else "idle",
        "cells": max((status.cells for status in seen), default=0),
        "seconds": round(session.clock() - session.began, 1),
        "began": time.time() - (session.clock() - session.began),
        "cpu": round(statistics.fmean(status.cpu for status in seen), 1) if seen else None,
        "memory": max((status.rss for status in seen), default=None),
        "gpu": max((status.gpu_text() for status in seen if status.gpu >= 0), default=""),
        "launcher": "torch.distributed" if session.options.launcher == "torch" else "Horovod",
    }


def ended(launcher: Launcher) -> int | None:
    """The session's processes' exit code once one has ended: the job's; where a rank's own
    process ended while the others wait for it, SILENT_EXIT if each that ended left for the
    notebook's silence, else 1 (its launcher's deaths say which, and how)."""
    code = launcher.poll()
    if code is None and (gone := launcher.exited()):
        return SILENT_EXIT if set(gone.values()) == {SILENT_EXIT} else 1
    return code
