"""Coarser copies of a span store, so that a wide window costs its pixels, not its spans.

A level keeps, per row and depth, every span at least ``bucket`` µs long as itself and merges the
narrower ones that start in the same bucket (buckets of ``bucket`` µs from the timeline's start)
into one item: first start to last end, how many spans, and the longest span's length and kind
(which gives a mark its kind). Buckets double from level to level, each level merged from the
one below it. The finest level has the narrowest bucket that still merges about eight spans into
one: a window finer than that is answered from the spans themselves, a few per pixel. An item
takes 32 bytes; all levels together hold about half as many items as there are spans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .store import SpanStore

__all__ = [
    "Items",
    "Level",
    "bucket_edges",
    "build_levels",
    "kind_count",
    "merge_edges",
    "ranges_index",
    "span_items",
]

MERGE = 8  # the finest level holds at most 1/MERGE as many items as there are spans
CHUNK = 1 << 19  # spans merged at a time when the finest level is built (bounds the scratch memory)


@dataclass
class Items:
    """Spans or merged items in runs (a run is a depth and a row: ``depth * rows + row``), each
    run's items by start. ``lead`` is the longest member span's duration * kinds + its kind:
    the largest ``lead`` of a merge names the merged item's kind."""

    start: np.ndarray  # int64, absolute µs
    duration: np.ndarray  # int64: first start to last end
    lead: np.ndarray  # int64
    count: np.ndarray  # uint32: spans in the item
    run: np.ndarray  # int32

    def __len__(self) -> int:
        return len(self.start)

    def take(self, index: np.ndarray) -> Items:
        return Items(*(c[index] for c in (self.start, self.duration, self.lead, self.count, self.run)))


@dataclass
class Level:
    """One resolution: items sorted by run then start; run ``k``'s are ``offsets[k]:offsets[k + 1]``."""

    bucket: int
    items: Items
    offsets: np.ndarray
    reach: np.ndarray  # per run: its longest item (how far before a window one that reaches it starts)

    def select(self, runs: list[int], t0: int, t1: int) -> Items:
        """The items of ``runs`` (ascending) that may reach into [t0, t1], in run order."""
        ranges = []
        for run in runs:
            lo, hi = int(self.offsets[run]), int(self.offsets[run + 1])
            starts = self.items.start[lo:hi]
            first = lo + int(np.searchsorted(starts, t0 - self.reach[run], side="left"))
            ranges.append((first, lo + int(np.searchsorted(starts, t1, side="right"))))
        return self.items.take(ranges_index(ranges))


def ranges_index(ranges: list[tuple[int, int]]) -> np.ndarray:
    """The indices of the ranges ``[lo, hi)``, one after another."""
    return np.concatenate([np.arange(lo, hi) for lo, hi in ranges] or [np.empty(0, np.int64)])


def merge_edges(items: Items, edge: np.ndarray) -> Items:
    """Merges each group of consecutive items that starts where ``edge`` is True (items sorted by
    run then start; a group never crosses runs)."""
    if not len(items):
        return items
    firsts = np.flatnonzero(edge)
    start = items.start[firsts]
    end = np.maximum.reduceat(items.start + items.duration, firsts)
    return Items(
        start=start,
        duration=end - start,
        lead=np.maximum.reduceat(items.lead, firsts),
        count=np.add.reduceat(items.count, firsts, dtype=np.uint32),
        run=items.run[firsts],
    )


def bucket_edges(items: Items, cell: np.ndarray, width: float) -> np.ndarray:
    """Where a group starts: a new run or cell, or a span at least ``width`` long (which stays
    on its own). Merged items merge on, however far they reach: their spans are all narrower."""
    wide = (items.count == 1) & (items.duration >= width)
    edge = np.ones(len(items), bool)
    edge[1:] = (items.run[1:] != items.run[:-1]) | (cell[1:] != cell[:-1]) | wide[1:] | wide[:-1]
    return edge


def _level(items: Items, bucket: int, origin: int, runs: int) -> Level:
    cell = (items.start - origin) // bucket
    merged = merge_edges(items, bucket_edges(items, cell, bucket))
    offsets = np.searchsorted(merged.run, np.arange(runs + 1)).astype(np.int64)
    reach = np.zeros(runs, np.int64)
    filled = np.flatnonzero(np.diff(offsets))
    if len(filled):
        reach[filled] = np.maximum.reduceat(merged.duration, offsets[filled])
    return Level(bucket, merged, offsets, reach)


def span_items(store: SpanStore, index: np.ndarray) -> Items:
    """The store's spans at ``index`` (in run order: depth, row, start) as items of one span."""
    duration = store.duration[index].astype(np.int64)
    return Items(
        start=store.start[index],
        duration=duration,
        lead=duration * kind_count(store) + store.kind[index],
        count=np.ones(len(index), np.uint32),
        run=store.depth[index].astype(np.int32) * len(store.row_names) + store.row[index],
    )


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


def _joined(pieces: list[Items]) -> Items:
    """The pieces as one, a column at a time, each piece's column dropped once copied (the
    pieces are held once, not twice). Empties ``pieces``."""
    columns = [list(c) for c in zip(*(vars(p).values() for p in pieces), strict=True)]
    pieces.clear()
    joined = []
    while columns:
        parts = columns.pop(0)
        joined.append(np.concatenate(parts))
        parts.clear()
    return Items(*joined)


def kind_count(store: SpanStore) -> int:
    """The ``kinds`` of an item's ``lead`` (longest * kinds + kind)."""
    return max(len(store.kind_names), 1)


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
    depths = int(store.depth.max()) + 1
    runs = depths * len(store.row_names)
    pieces = []
    for depth in range(depths):  # runs are depth-major: one depth after another
        for lo in range(0, len(store), CHUNK):
            chunk = span_items(store, lo + np.flatnonzero(store.depth[lo : lo + CHUNK] == depth))
            pieces.append(merge_edges(chunk, bucket_edges(chunk, (chunk.start - origin) // bucket, bucket)))
    levels = [_level(_joined(pieces), bucket, origin, runs)]  # merges what the chunk borders cut apart
    while len(levels[-1].items) > smallest and levels[-1].bucket < length:
        levels.append(_level(levels[-1].items, 2 * levels[-1].bucket, origin, runs))
    return levels
