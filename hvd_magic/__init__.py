"""hvd_magic: run a notebook cell as a Horovod job with ``%%horovod np=N``."""

from __future__ import annotations

from .errors import (
    CaptureError,
    HorovodMagicError,
    LaunchError,
    RankFailedError,
    RunError,
    RunInterrupted,
    RunTimeout,
)
from .reporting import report

__all__ = [
    "CaptureError",
    "HorovodMagicError",
    "HorovodRunner",
    "LaunchError",
    "RankFailedError",
    "RunError",
    "RunInterrupted",
    "RunTimeout",
    "load_ipython_extension",
    "report",
]


def __getattr__(name: str) -> object:
    # HorovodRunner pulls in the launchers; keep `import hvd_magic` cheap on the ranks.
    if name == "HorovodRunner":
        from .runner import HorovodRunner

        return HorovodRunner
    raise AttributeError(f"module 'hvd_magic' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext hvd_magic``: registers ``%%horovod``."""
    from .magic import HorovodMagics

    ipython.register_magics(HorovodMagics)  # type: ignore[attr-defined]
