"""``hvd_magic.resized()``: whether this attempt of a run runs on another number of ranks than
the one before (``min_np=``), so that the code can rescale what depends on it.

>>> change = hvd_magic.resized()                                    # doctest: +SKIP
>>> if change is not None:
...     old, new = change
...     for group in optimizer.param_groups:
...         group["lr"] *= new / old          # the usual rule: the learning rate scales with the ranks
"""

from __future__ import annotations

import os

from hvd_magic.protocol import ENV_RESIZED

__all__ = ["resized"]


def resized() -> tuple[int, int] | None:
    """``(old, new)`` ranks when this attempt was resized from the one before; None otherwise
    (the first attempt, a retry at the same size, outside a run)."""
    value = os.environ.get(ENV_RESIZED)
    if not value:
        return None
    old, _, new = value.partition(",")
    return int(old), int(new)
