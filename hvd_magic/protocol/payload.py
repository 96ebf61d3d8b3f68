"""What the ranks run: a notebook cell or a function, pickled by capture, loaded by the worker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CELL_FILENAME", "SILENT_EXIT", "CellPayload", "FunctionPayload", "PostMortem", "SessionPayload"]

CELL_FILENAME = "<horovod cell>"  # the cell's name in tracebacks


@dataclass
class CellPayload:
    source: str
    namespace: dict[str, Any]
    return_names: list[str] = field(default_factory=list)
    silent: bool = False  # the cell ends with ";": no output value, as in IPython


@dataclass
class FunctionPayload:
    function: Callable[..., Any]
    kwargs: dict[str, Any]


@dataclass
class PostMortem:
    """A live session's ``%horovod debug``: pdb where the rank's last cell failed (its value:
    what to say instead, when it did not)."""


# A session rank's exit code when it left because the notebook was silent: it ran no cell that
# came after (its inbox stopped reading), so the notebook may run that cell on a new session.
SILENT_EXIT = 75


@dataclass
class SessionPayload:
    """A live session's ranks: run ``first`` (the framework's set-up), then serve cells until
    told to stop or until the notebook is silent for ``silence`` seconds."""

    first: CellPayload
    silence: float = 20.0
