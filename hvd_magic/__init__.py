"""hvd_magic: run a notebook cell as a Horovod job with ``%%horovod np=N``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hvd_magic.errors import (
    CaptureError,
    DataError,
    FailureClass,
    HorovodMagicError,
    LaunchError,
    RankFailedError,
    RunError,
    RunInterrupted,
    RunTimeout,
    SessionEnded,
)

if TYPE_CHECKING:  # what type checkers and editors see of the names imported on first use
    from hvd_magic.rank.progress import progress
    from hvd_magic.rank.reporting import report

__all__ = [
    "CaptureError",
    "DataError",
    "FailureClass",
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
    "resized",
    "resume",
    "shard",
    "stopping",
    "timeline",
]


def __getattr__(name: str) -> object:
    """The names of ``__all__`` beyond the exception tree, imported on first use (PEP 562):
    ``import hvd_magic`` stays the errors alone for what runs it without a rank's client (the
    orted agents, Spark's Python workers, the doctor's probes), 0.2 CPU-s less each."""
    if name == "progress":  # a rank's progress bar (its reporting client comes with it)
        from hvd_magic.rank.progress import progress

        return progress
    if name == "report":  # a rank's metrics for the live view
        from hvd_magic.rank.reporting import report

        return report
    # HorovodRunner pulls in the launchers; keep `import hvd_magic` cheap on the ranks.
    if name == "HorovodRunner":
        from hvd_magic.notebook.runner import HorovodRunner

        return HorovodRunner
    if name == "TorchDistributor":  # Spark's TorchDistributor's signature on the same runs
        from hvd_magic.notebook.distributor import TorchDistributor

        return TorchDistributor
    if name in ("checkpoint", "resume", "stopping"):  # keeping a long run's work, from a rank
        from hvd_magic.rank import checkpoints

        return getattr(checkpoints, name)
    if name == "Session":  # a live session from Python: ranks kept across calls
        from hvd_magic.session.api import Session

        return Session
    if name == "LiveCallback":  # a Keras callback: built on first use, so TensorFlow loads only then
        from hvd_magic.rank import progress as loops

        return loops.LiveCallback
    if name == "resized":  # min_np=: this attempt's ranks, resized from the last's
        from hvd_magic.rank.resized import resized

        return resized
    if name == "shard":
        from hvd_magic.data import shard

        return shard
    if name == "timeline":
        import importlib

        return importlib.import_module(".timeline", __name__)
    raise AttributeError(f"module 'hvd_magic' has no attribute {name!r}")


def __dir__() -> list[str]:
    """Every public name, the lazy ones too (IPython's completion of ``hvd_magic.<tab>``)."""
    return sorted({*globals(), *__all__})


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext hvd_magic``: registers ``%%horovod``."""
    from hvd_magic.notebook.magics import HorovodMagics

    ipython.register_magics(HorovodMagics)  # type: ignore[attr-defined]
