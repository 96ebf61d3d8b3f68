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

from hvd_magic.timeline.levels import Level, store_items
from hvd_magic.timeline.merging import merge, ranges_index, reaching
from hvd_magic.timeline.store import SpanStore

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

    def packed(self, rows: list[int]) -> tuple[dict[str, int], list[bytes]]:
        """The marks of ``rows`` (ascending) as a window reply carries them, 15 bytes a mark rather
        than 23: starts as whole µs after ``base`` in 32 bits (in 64-bit floats when a mark starts
        2^32 µs or more after the first), durations, how many marks each row has, kinds, depths,
        counts. Returns the reply's fields (base, start_bits) and its buffers."""
        base = int(self.start.min()) if len(self) else 0
        after = self.start - base
        narrow = not len(self) or float(after.max()) < 2**32
        starts = after.astype(np.uint32) if narrow else self.start
        asked = np.asarray(rows, np.int32)
        per_row = np.searchsorted(self.row, asked, "right") - np.searchsorted(self.row, asked, "left")
        columns = (starts, self.duration, per_row.astype(np.int32), self.kind, self.depth, self.count)
        return {"base": base if narrow else 0, "start_bits": 32 if narrow else 64}, [
            c.tobytes() for c in columns
        ]


def no_marks() -> Marks:
    empty = np.empty(0)
    return Marks(
        *(empty.astype(t) for t in (np.float64, np.float32, np.int32, np.uint16, np.uint8, np.uint32))
    )


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
    ranges = reaching(store.start, store.offsets, store.max_duration, rows, t0, t1)
    if sum(hi - lo for lo, hi in ranges) <= limit:
        index = ranges_index(ranges)
        index = index[store.start[index] + store.duration[index] >= t0]
        columns = (store.start, store.duration, store.row, store.kind, store.depth)
        start, duration, row, kind, depth = (c[index] for c in columns)
        return _marks(start, duration, row, kind, depth, np.ones(len(index), np.uint32), origin)
    pixel = max(t1 - t0, 1) / width
    level = next((level for level in reversed(levels) if level.bucket <= pixel), None)
    if level is None:
        items = store_items(store)
    else:
        items, ranges = level.items, reaching(level.items.start, level.offsets, level.reach, rows, t0, t1)
    merged, per_row = merge(items, ranges, t0, pixel, width)
    row = np.repeat(np.asarray(rows, np.int32), per_row)
    return _marks(merged.start, merged.duration, row, merged.kind, merged.depth, merged.counts(), origin)


def _marks(
    start: np.ndarray,
    duration: np.ndarray,
    row: np.ndarray,
    kind: np.ndarray,
    depth: np.ndarray,
    count: np.ndarray,
    origin: int,
) -> Marks:
    """Marks of columns already by row, then start (rows are asked in order, each by start)."""
    return Marks(
        start=(start - origin).astype(np.float64),
        duration=duration.astype(np.float32),
        row=row.astype(np.int32),
        kind=kind.astype(np.uint16),
        depth=np.minimum(depth, 2).astype(np.uint8),
        count=count.astype(np.uint32),
    )
