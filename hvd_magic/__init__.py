"""hvd_magic: run a notebook cell as a Horovod job with ``%%horovod np=N``."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hvd_magic.errors import (
    CaptureError,
    CheckpointError,
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

if TYPE_CHECKING:  # the two that were imported eagerly once, typed for checkers and editors
    from hvd_magic.rank.progress import progress
    from hvd_magic.rank.reporting import report

__all__ = [
    "CaptureError",
    "CheckpointError",
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


# The names of ``__all__`` beyond the exception tree: imported on first use (PEP 562), each from
# the module named here (``timeline`` is that module itself), so that ``import hvd_magic`` is the
# exception tree alone (no launchers, no zmq, no TensorFlow for ``LiveCallback``).
_ON_FIRST_USE = {
    "HorovodRunner": "hvd_magic.notebook.runner",
    "LiveCallback": "hvd_magic.rank.progress",  # a Keras callback, built on first use
    "Session": "hvd_magic.session.api",  # a live session from Python: ranks kept across calls
    "TorchDistributor": "hvd_magic.notebook.distributor",  # Spark's TorchDistributor's signature
    "checkpoint": "hvd_magic.rank.checkpoints",  # keeping a long run's work, from a rank
    "progress": "hvd_magic.rank.progress",
    "report": "hvd_magic.rank.reporting",
    "resized": "hvd_magic.rank.resized",  # min_np=: this attempt's ranks, resized from the last's
    "resume": "hvd_magic.rank.checkpoints",
    "shard": "hvd_magic.data",
    "stopping": "hvd_magic.rank.checkpoints",
    "timeline": "hvd_magic.timeline",
}


def __getattr__(name: str) -> object:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module 'hvd_magic' has no attribute {name!r}")
    module = importlib.import_module(_ON_FIRST_USE[name])
    return module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)


def __dir__() -> list[str]:
    """Every public name, the lazy ones too (IPython's completion of ``hvd_magic.<tab>``)."""
    return sorted({*globals(), *__all__})


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext hvd_magic``: registers ``%%horovod``; in a kernel, warms the live view."""
    from hvd_magic.notebook.magics import HorovodMagics
    from hvd_magic.run.views import warm_view

    ipython.register_magics(HorovodMagics)  # type: ignore[attr-defined]
    warm_view()
