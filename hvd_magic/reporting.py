"""``hvd_magic.report(step=..., total=..., **metrics)``: progress and metrics from a rank.

Cheap and never blocking: outside a ``%%horovod`` run it does nothing; inside one it hands the
record to the rank's hub connection, which drops (and counts) records if its queue is full.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hub import HubClient

__all__ = ["report"]

_client: HubClient | None = None
dropped = 0


def _attach(client: HubClient) -> None:
    global _client
    _client = client


def _detach() -> None:
    global _client
    _client = None


def report(
    step: int | None = None,
    total: int | None = None,
    epoch: int | None = None,
    **metrics: float,
) -> None:
    """Report progress and metrics of this rank to the notebook.

    >>> for step, batch in enumerate(loader):              # doctest: +SKIP
    ...     loss = train_step(batch)
    ...     hvd_magic.report(step=step, total=len(loader), loss=loss)
    """
    global dropped
    client = _client
    if client is None:
        return
    record: dict[str, Any] = {"t": time.time()}
    if step is not None:
        record["step"] = int(step)
    if total is not None:
        record["total"] = int(total)
    if epoch is not None:
        record["epoch"] = int(epoch)
    record["metrics"] = {k: float(v) for k, v in metrics.items()}
    if not client.send("report", record):
        dropped += 1
