"""hvd_magic: run a notebook cell as a Horovod job with ``%%horovod np=N``."""

from __future__ import annotations

from .callbacks import progress
from .errors import (
    CaptureError,
    DataError,
    HorovodMagicError,
    LaunchError,
    RankFailedError,
    RunError,
    RunInterrupted,
    RunTimeout,
    SessionEnded,
)
from .reporting import report

__all__ = [
    "CaptureError",
    "DataError",
    "HorovodMagicError",
    "HorovodRunner",
    "LaunchError",
    "LiveCallback",
    "RankFailedError",
    "RunError",
    "RunInterrupted",
    "RunTimeout",
    "Session",
    "SessionEnded",
    "TorchDistributor",
    "checkpoint",
    "load_ipython_extension",
    "progress",
    "report",
    "resume",
    "shard",
    "stopping",
    "timeline",
]


def __getattr__(name: str) -> object:
    # HorovodRunner pulls in the launchers; keep `import hvd_magic` cheap on the ranks.
    if name == "HorovodRunner":
        from .runner import HorovodRunner

        return HorovodRunner
    if name == "TorchDistributor":  # Spark's TorchDistributor's signature on the same engine
        from .distributor import TorchDistributor

        return TorchDistributor
    if name in ("checkpoint", "resume", "stopping"):  # keeping a long run's work, from a rank
        from . import checkpoints

        return getattr(checkpoints, name)
    if name == "Session":  # a live session from Python: ranks kept across calls
        from .session.api import Session

        return Session
    if name == "LiveCallback":  # a Keras callback: built on first use, so TensorFlow loads only then
        from . import callbacks

        return callbacks.LiveCallback
    if name == "shard":
        from .data import shard

        return shard
    if name == "timeline":
        import importlib

        return importlib.import_module(".timeline", __name__)
    raise AttributeError(f"module 'hvd_magic' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext hvd_magic``: registers ``%%horovod``."""
    from .magic import HorovodMagics

    ipython.register_magics(HorovodMagics)  # type: ignore[attr-defined]
