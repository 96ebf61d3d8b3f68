"""Coarser copies of a span store, so that a wide window costs its pixels, not its spans.

A level keeps, per row and depth, every span at least ``bucket`` µs long as itself and merges the
narrower ones that start in the same bucket (buckets of ``bucket`` µs from the timeline's start)
into one item: first start to last end, how many spans, and the longest span's length and kind
(``merging.merge``). Buckets double from level to level, each level merged from the one below
it. The finest level has the narrowest bucket that still merges about eight spans into one: a
window finer than that is answered from the spans themselves. A level is laid out as the store
is (each row's items by start), and an item takes about 22 bytes (durations in 32 bits where they
fit); all levels together hold about half as many items as there are spans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hvd_magic.timeline.merging import Items, merge
from hvd_magic.timeline.store import SpanStore

__all__ = ["Level", "build_levels", "store_items"]

MERGE = 8  # the finest level holds at most 1/MERGE as many items as there are spans
CHUNK = 1 << 21  # spans counted at a time when the finest bucket is sought (bounds the scratch memory)


@dataclass
class Level:
    """One resolution: row ``r``'s items are ``offsets[r]:offsets[r + 1]``, by start."""

    bucket: int
    items: Items
    offsets: np.ndarray
    reach: np.ndarray  # per row: its longest item (how far before a window one that reaches it starts)

    def rows(self) -> list[tuple[int, int]]:
        """Each row's range of items."""
        return list(zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist(), strict=True))


def store_items(store: SpanStore) -> Items:
    """The store's spans as items of one span each."""
    return Items(store.start, store.duration, None, store.kind, store.depth, None)


def _narrow(column: np.ndarray) -> np.ndarray:
    """An int64 column in 32 bits when every value fits."""
    if len(column) and 0 <= int(column.min()) and int(column.max()) <= np.iinfo(np.uint32).max:
        return column.astype(np.uint32)
    return column


def _level(items: Items, rows: list[tuple[int, int]], origin: int, bucket: int) -> Level:
    merged, per_row = merge(items, rows, origin, bucket)
    merged.duration, merged.longest = _narrow(merged.duration), _narrow(merged.longest)  # type: ignore[arg-type]
    offsets = np.r_[0, np.cumsum(per_row)].astype(np.int64)
    reach = np.zeros(len(rows), np.int64)
    filled = np.flatnonzero(per_row)
    if len(filled):
        reach[filled] = np.maximum.reduceat(merged.duration, offsets[filled])
    return Level(bucket, merged, offsets, reach)


def _cells(store: SpanStore, bucket: int, origin: int) -> int:
    """About how many items a level of ``bucket`` would hold (its (row, bucket) pairs)."""
    total = 0
    for lo in range(0, len(store), CHUNK):
        hi = min(lo + CHUNK + 1, len(store))
        cell = (store.start[lo:hi] - origin) // bucket
        row = store.row[lo:hi]
        total += int(np.count_nonzero((cell[1:] != cell[:-1]) | (row[1:] != row[:-1])))
    return total + 1


def _finest_bucket(store: SpanStore, origin: int, length: int) -> int | None:
    """The narrowest power-of-two bucket (µs) that merges spans about MERGE to one, or None."""
    exponents = list(range(max(length, 1).bit_length() + 1))
    if _cells(store, 1 << exponents[-1], origin) * MERGE > len(store):
        return None
    lo, hi = 0, len(exponents) - 1  # the answer is in exponents[lo..hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if _cells(store, 1 << exponents[mid], origin) * MERGE <= len(store):
            hi = mid
        else:
            lo = mid + 1
    return 1 << exponents[lo]


def build_levels(store: SpanStore, smallest: int) -> list[Level]:
    """Levels from finest to coarsest, until one holds about ``smallest`` items; [] when no level
    would merge enough to be worth its memory."""
    if not len(store):
        return []
    origin = store.first_start
    length = store.last_end - origin
    bucket = _finest_bucket(store, origin, length)
    if bucket is None:
        return []
    rows = list(zip(store.offsets[:-1].tolist(), store.offsets[1:].tolist(), strict=True))
    levels = [_level(store_items(store), rows, origin, bucket)]
    while len(levels[-1].items) > smallest and levels[-1].bucket < length:
        finer = levels[-1]
        levels.append(_level(finer.items, finer.rows(), origin, 2 * finer.bucket))
    return levels
