"""What the viewer's screen shows of a window of the timeline: level of detail in the kernel.

For a time window, some rows and a width in pixels, the marks to draw: the spans themselves
when few enough reach into the window, otherwise each span at least a pixel wide as itself and
the narrower ones merged, per row, depth and pixel, into one mark (how many, from the first
start to the last end, the kind of the longest), and neighbouring merged marks of one kind less
than a pixel apart joined into one block. A wide window is merged from the coarsest level of
detail (``levels``) whose bucket fits in a pixel rather than from the spans. The marks, and the
work, are then bounded by the pixels, not by the events: a 3 GB timeline crosses to the browser
a screen at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .levels import Items, Level, bucket_edges, kind_count, merge_edges, ranges_index, span_items
from .store import SpanStore

__all__ = ["Marks", "no_marks", "window"]


@dataclass
class Marks:
    """Marks sorted by row then start; times in microseconds from ``origin``."""

    start: np.ndarray  # float64
    duration: np.ndarray  # float32
    row: np.ndarray  # int32
    kind: np.ndarray  # uint16: an index into the activity names
    depth: np.ndarray  # uint8
    count: np.ndarray  # uint32: spans in the mark (1: a span itself)

    def __len__(self) -> int:
        return len(self.start)

    def buffers(self) -> list[bytes]:
        """The columns as the viewer's front end reads them (little-endian, its dtypes)."""
        return [c.tobytes() for c in (self.start, self.duration, self.row, self.kind, self.depth, self.count)]


def no_marks() -> Marks:
    empty = np.empty(0)
    return Marks(
        *(empty.astype(t) for t in (np.float64, np.float32, np.int32, np.uint16, np.uint8, np.uint32))
    )


def _reaching(store: SpanStore, row: int, t0: int, t1: int) -> tuple[int, int]:
    """Index range of the row's spans that may reach into [t0, t1]: those starting after
    t0 less the row's longest span, and no later than t1."""
    lo, hi = int(store.offsets[row]), int(store.offsets[row + 1])
    starts = store.start[lo:hi]
    first = lo + int(np.searchsorted(starts, t0 - store.max_duration[row], side="left"))
    last = lo + int(np.searchsorted(starts, t1, side="right"))
    return first, last


def window(
    store: SpanStore,
    t0: int,
    t1: int,
    width: int,
    rows: list[int],
    limit: int,
    origin: int,
    levels: Sequence[Level] = (),
) -> Marks:
    """The marks of ``rows`` (ascending) for [t0, t1] (absolute µs) on ``width`` pixels: every
    span when at most ``limit`` reach into the window, else per-pixel merges of narrow spans,
    taken from the coarsest of ``levels`` whose bucket fits in a pixel, or from the spans."""
    ranges = [_reaching(store, row, t0, t1) for row in rows]
    if sum(hi - lo for lo, hi in ranges) <= limit:
        index = ranges_index(ranges)
        index = index[store.start[index] + store.duration[index] >= t0]
        columns = (store.start, store.duration, store.row, store.kind, store.depth)
        start, duration, row, kind, depth = (c[index] for c in columns)
        return _marks(start, duration, row, kind, depth, np.ones(len(index), np.int64), origin)
    kinds, row_count = kind_count(store), len(store.row_names)
    pixel = max(t1 - t0, 1) / width
    level = next((level for level in reversed(levels) if level.bucket <= pixel), None)
    if level is not None:
        depths = (len(level.offsets) - 1) // max(row_count, 1)
        items = level.select([d * row_count + r for d in range(depths) for r in rows], t0, t1)
    else:
        index = ranges_index(ranges)
        items = span_items(store, index[np.argsort(store.depth[index], kind="stable")])  # run order
    merged = _per_pixel(items, t0, pixel, width, kinds)
    depth, row = np.divmod(merged.run, max(row_count, 1))
    kind = merged.lead % kinds
    return _marks(merged.start, merged.duration, row, kind, depth, merged.count, origin)


def _marks(
    start: np.ndarray,
    duration: np.ndarray,
    row: np.ndarray,
    kind: np.ndarray,
    depth: np.ndarray,
    count: np.ndarray,
    origin: int,
) -> Marks:
    order = np.lexsort((start, row))
    return Marks(
        start=(start[order] - origin).astype(np.float64),
        duration=duration[order].astype(np.float32),
        row=row[order].astype(np.int32),
        kind=kind[order].astype(np.uint16),
        depth=np.minimum(depth[order], 2).astype(np.uint8),
        count=count[order].astype(np.uint32),
    )


def _per_pixel(items: Items, t0: int, pixel: float, width: int, kinds: int) -> Items:
    """Items narrower than a pixel merged per run and pixel (wide ones kept), then neighbours of
    one kind less than a pixel apart joined, as the screen would show them: one block. Spans a
    pixel wide or more stay themselves, so hovering one still tells its own times."""
    items = items.take(np.flatnonzero(items.start + items.duration >= t0))
    cell = np.clip(((items.start - t0) / pixel).astype(np.int64), 0, width - 1)
    merged = merge_edges(items, bucket_edges(items, cell, pixel))
    if len(merged) < 2:
        return merged
    kind = merged.lead % kinds
    alone = (merged.count == 1) & (merged.duration >= pixel)
    end = merged.start + merged.duration
    join = np.zeros(len(merged), bool)
    join[1:] = (
        (merged.run[1:] == merged.run[:-1])
        & (kind[1:] == kind[:-1])
        & (merged.start[1:] - end[:-1] < pixel)
        & ~alone[1:]
        & ~alone[:-1]
    )
    return merge_edges(merged, ~join)
