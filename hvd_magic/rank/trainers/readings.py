"""What the trainers' callbacks read from a step: its loss, at most ten times a second, and the
plain numbers among a trainer's logs (rank side, pure)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["LossReading", "numbers"]

READ_EVERY = 0.1  # seconds: a loss is read (a device sync on a GPU) at most this often, the view's rate


class LossReading:
    """A step's loss (a tensor, maybe on a GPU) read at most every ``READ_EVERY`` seconds: the
    view redraws ten times a second, and each read waits for the device."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: float | None = None

    def read(self, loss: Any) -> float | None:
        now = self._clock()
        if loss is None or (self._last is not None and now - self._last < READ_EVERY):
            return None
        self._last = now
        try:
            return float(loss.detach().float().mean().item() if hasattr(loss, "detach") else loss)
        except (TypeError, ValueError, RuntimeError):
            return None


def numbers(values: dict[str, Any] | None, leave: tuple[str, ...] = ()) -> dict[str, Any]:
    """The plain numbers among ``values`` (one-element tensors too) as floats, but those named in
    ``leave``: keywords for ``report``."""
    found: dict[str, Any] = {}
    for name, value in (values or {}).items():
        if name in leave or isinstance(value, bool):
            continue
        if hasattr(value, "numel") and value.numel() == 1:
            value = value.item()
        if isinstance(value, (int, float)):
            found[str(name)] = float(value)
    return found
