"""Items merged per pixel of a window (what the viewer draws) or per bucket of time (a level of
detail): one function, :func:`merge`, over rows of items, each row's by start.

Per row and depth, an item at least a pixel (bucket) long that stands for one span stays itself;
the others that start in the same pixel merge into one item: first start to last end, how many
spans, and the longest member's length and kind (which gives a mark its kind). In a window, items
that end before it are left out, pixels are clipped to it, and neighbouring merged items of one
kind less than a pixel apart join into one block, as the screen would show them. The merged items
of a row come in the order of their first members, so by start.

``_match.merge`` does it in one pass in C; :func:`merge_numpy` is the same in numpy (a few dozen
passes), for an install without a C compiler and as the reference in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BATCH", "Items", "merge", "merge_numpy", "ranges_index", "reaching"]

BATCH = 1 << 20  # items merged at a time by numpy (bounds its scratch memory)
Ranges = Sequence[tuple[int, int]]


@dataclass
class Items:
    """Items in rows, each row's by start: spans (``longest`` and ``count`` None: each item is one
    span, its own longest) or merged items."""

    start: np.ndarray  # int64 µs
    duration: np.ndarray  # uint32 or int64: first start to last end
    longest: np.ndarray | None  # uint32 or int64: the longest member span's duration
    kind: np.ndarray  # uint8, uint16 or uint32: the longest member's kind
    depth: np.ndarray  # uint8
    count: np.ndarray | None  # uint32: the spans in each item

    def __len__(self) -> int:
        return len(self.start)

    def counts(self) -> np.ndarray:
        return np.ones(len(self), np.uint32) if self.count is None else self.count


def ranges_index(ranges: Ranges) -> np.ndarray:
    """The indices of the ranges ``[lo, hi)``, one after another."""
    return np.concatenate([np.arange(lo, hi) for lo, hi in ranges] or [np.empty(0, np.int64)])


def reaching(
    start: np.ndarray, offsets: np.ndarray, reach: np.ndarray, rows: Sequence[int], t0: float, t1: float
) -> list[tuple[int, int]]:
    """Per row, the range of its items that may reach into [t0, t1]: those starting after t0 less
    the row's longest item (``reach``), and no later than t1 (rows ``r``'s items are
    ``offsets[r]:offsets[r + 1]``, by start)."""
    ranges = []
    for row in rows:
        lo, hi = int(offsets[row]), int(offsets[row + 1])
        starts = start[lo:hi]
        first = lo + int(np.searchsorted(starts, t0 - reach[row], side="left"))
        ranges.append((first, lo + int(np.searchsorted(starts, t1, side="right"))))
    return ranges


def merge(items: Items, ranges: Ranges, t0: int, pixel: float, width: int = 0) -> tuple[Items, np.ndarray]:
    """The items of ``ranges`` (each a row's) merged per pixel of ``pixel`` µs from ``t0``: a
    window of ``width`` pixels, or with ``width`` 0 a level of detail (nothing left out, clipped
    or joined). Returns the merged items, one range's after the other, and how many each range got."""
    try:
        from hvd_magic.timeline._match import merge as merge_in_c
    except ImportError:
        return _in_batches(items, ranges, t0, pixel, width)
    pairs = np.asarray(ranges, np.int64).reshape(-1, 2)
    out = merge_in_c(
        items.start, items.duration, items.longest, items.kind, items.depth, items.count, pairs.tobytes(),
        int(t0), float(pixel), int(width),
    )  # fmt: skip
    dtypes: tuple[Any, ...] = (np.int64, np.int64, np.int64, items.kind.dtype, np.uint8, np.uint32, np.int64)
    start, duration, longest, kind, depth, count, per_range = (
        np.frombuffer(column, dtype) for column, dtype in zip(out, dtypes, strict=True)
    )
    return Items(start, duration, longest, kind, depth, count), per_range


def _in_batches(
    items: Items, ranges: Ranges, t0: int, pixel: float, width: int = 0
) -> tuple[Items, np.ndarray]:
    """``merge_numpy`` a few rows at a time (rows merge on their own), so that its scratch memory
    is bounded by ``BATCH`` items (or the longest row)."""
    batches: list[list[tuple[int, int]]] = [[]]
    size = 0
    for lo, hi in ranges:
        if size and size + hi - lo > BATCH:
            batches.append([])
            size = 0
        batches[-1].append((lo, hi))
        size += hi - lo
    parts = [merge_numpy(items, batch, t0, pixel, width) for batch in batches]
    columns = [np.concatenate(c) for c in zip(*(vars(p).values() for p, _ in parts), strict=True)]
    return Items(*columns), np.concatenate([got for _, got in parts])


def merge_numpy(
    items: Items, ranges: Ranges, t0: int, pixel: float, width: int = 0
) -> tuple[Items, np.ndarray]:
    """:func:`merge` in numpy."""
    index = ranges_index(ranges)
    which = np.repeat(np.arange(len(ranges)), [hi - lo for lo, hi in ranges])
    if width > 0:
        keep = items.start[index] + items.duration[index] >= t0
        index, which = index[keep], which[keep]
    order = np.lexsort((items.depth[index], which))  # stable: by range, depth, position
    index, which = index[order], which[order]
    start, duration = items.start[index], items.duration[index].astype(np.int64)
    longest = duration if items.longest is None else items.longest[index].astype(np.int64)
    kind, count = items.kind[index].astype(np.int64), items.counts()[index]
    kinds = int(kind.max()) + 1 if len(kind) else 1
    run = which * 256 + items.depth[index]
    cell = ((start - t0) / pixel).astype(np.int64)
    if width > 0:
        cell = np.clip(cell, 0, width - 1)
    wide = (count == 1) & (duration >= pixel)
    edge = np.ones(len(index), bool)
    edge[1:] = (run[1:] != run[:-1]) | (cell[1:] != cell[:-1]) | wide[1:] | wide[:-1]
    groups = _reduced(edge, start, start + duration, longest * kinds + kind, count, run, index)
    if width > 0:
        groups = _reduced(~_joins(groups, kinds, pixel), *groups)
    group_start, end, lead, count, run, first = groups
    placed = np.lexsort((first, run // 256))  # a range's items by their first member
    merged = Items(
        start=group_start[placed],
        duration=(end - group_start)[placed],
        longest=(lead // kinds)[placed],
        kind=(lead % kinds)[placed].astype(items.kind.dtype),
        depth=(run % 256)[placed].astype(np.uint8),
        count=count[placed].astype(np.uint32),
    )
    return merged, np.bincount(run // 256, minlength=len(ranges)).astype(np.int64)


def _reduced(edge: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each group of consecutive entries that starts where ``edge`` is True as one: columns
    start, end, lead, count, run, first (first member's position): the first start, the last
    end, the largest lead, the summed count, its run and first position."""
    start, end, lead, count, run, first = columns
    firsts = np.flatnonzero(edge)
    if not len(firsts):
        return columns
    return (
        start[firsts],
        np.maximum.reduceat(end, firsts),
        np.maximum.reduceat(lead, firsts),
        np.add.reduceat(count.astype(np.int64), firsts),
        run[firsts],
        first[firsts],
    )


def _joins(groups: tuple[np.ndarray, ...], kinds: int, pixel: float) -> np.ndarray:
    """Which merged groups join the one before them: same run and kind, less than a pixel
    apart, neither a span a pixel long or more on its own."""
    start, end, lead, count, run, _first = groups
    kind = lead % kinds
    alone = (count == 1) & (end - start >= pixel)
    join = np.zeros(len(start), bool)
    join[1:] = (
        (run[1:] == run[:-1])
        & (kind[1:] == kind[:-1])
        & (start[1:] - end[:-1] < pixel)
        & ~alone[1:]
        & ~alone[:-1]
    )
    return join
