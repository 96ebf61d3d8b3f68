"""The notebook's side of torch ranks' stalls: their ``Waiting`` records (sent by each rank's
``rank.stalls.WaitWatch``) turned into a ``Stall`` naming the ranks that never reached the call
the others wait in (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from hvd_magic.protocol import Stall

__all__ = ["WaitSeen", "waiting_stall"]


@dataclass(frozen=True)
class WaitSeen:
    """A rank waits in ``call`` (called from ``where``) since ``since`` (the run's clock)."""

    call: str
    where: str
    since: float


def waiting_stall(waits: dict[int, WaitSeen], ranks: int, now: float, threshold: float) -> Stall | None:
    """Once a rank has waited ``threshold`` seconds: the ranks not waiting, or waiting in another
    call (a mismatch: neither can go on), never reached the call the longest waiter is in."""
    longest = min(waits.values(), key=lambda wait: wait.since, default=None)
    if longest is None or now - longest.since < threshold:
        return None
    behind = [rank for rank in range(ranks) if rank not in waits or waits[rank].call != longest.call]
    if not behind:
        return None  # every rank waits in the same call: a long one
    call = f"{longest.call} ({longest.where})" if longest.where else longest.call
    return Stall(behind, [[call] for _ in behind], threshold, action="reached", source="")
