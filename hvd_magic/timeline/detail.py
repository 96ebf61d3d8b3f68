"""What the viewer's screen shows of a window of the timeline: level of detail in the kernel.

For a time window, some rows and a width in pixels, the marks to draw: the spans themselves
when few enough reach into the window, otherwise each span at least a pixel wide as itself and
the narrower ones merged, per row, depth and pixel, into one mark (how many, from the first
start to the last end, the kind of the longest). The marks are then bounded by the pixels, not
by the events: a 3 GB timeline crosses to the browser a screen at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .store import SpanStore

__all__ = ["Marks", "no_marks", "window"]


@dataclass
class Marks:
    """Marks sorted by row then start; times in microseconds from ``origin``."""

    start: np.ndarray  # float64
    duration: np.ndarray  # float32
    row: np.ndarray  # int32
    kind: np.ndarray  # uint8
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
        *(empty.astype(t) for t in (np.float64, np.float32, np.int32, np.uint8, np.uint8, np.uint32))
    )


def _reaching(store: SpanStore, row: int, t0: int, t1: int) -> tuple[int, int]:
    """Index range of the row's spans that may reach into [t0, t1]: those starting after
    t0 less the row's longest span, and no later than t1."""
    lo, hi = int(store.offsets[row]), int(store.offsets[row + 1])
    starts = store.start[lo:hi]
    first = lo + int(np.searchsorted(starts, t0 - store.max_duration[row], side="left"))
    last = lo + int(np.searchsorted(starts, t1, side="right"))
    return first, last


def window(store: SpanStore, t0: int, t1: int, width: int, rows: list[int], limit: int, origin: int) -> Marks:
    """The marks of ``rows`` for [t0, t1] (absolute microseconds) on ``width`` pixels: every
    span when at most ``limit`` reach into the window, else per-pixel merges of narrow spans."""
    ranges = [(row, *_reaching(store, row, t0, t1)) for row in rows]
    total = sum(hi - lo for _, lo, hi in ranges)
    scale = width / max(t1 - t0, 1)
    pieces = [_row_marks(store, row, lo, hi, t0, scale, width, merge=total > limit) for row, lo, hi in ranges]
    pieces = [p for p in pieces if p is not None]
    if not pieces:
        return no_marks()
    start, duration, row, kind, depth, count = (np.concatenate(c) for c in zip(*pieces, strict=True))
    return Marks(
        start=(start - origin).astype(np.float64),
        duration=duration.astype(np.float32),
        row=row.astype(np.int32),
        kind=np.minimum(kind, 255).astype(np.uint8),
        depth=np.minimum(depth, 2).astype(np.uint8),
        count=count.astype(np.uint32),
    )


Piece = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _row_marks(
    store: SpanStore, row: int, lo: int, hi: int, t0: int, scale: float, width: int, merge: bool
) -> Piece | None:
    start, duration = store.start[lo:hi], store.duration[lo:hi]
    inside = start + duration >= t0
    start, duration = start[inside], duration[inside]
    kind, depth = store.kind[lo:hi][inside], store.depth[lo:hi][inside]
    if not len(start):
        return None
    ones = np.ones(len(start), np.int64)
    if not merge:
        return start, duration, np.full(len(start), row), kind, depth, ones
    wide = duration * scale >= 1
    narrow = ~wide
    pixel = np.clip(((start[narrow] - t0) * scale).astype(np.int64), 0, width - 1)
    key = depth[narrow].astype(np.int64) * width + pixel
    groups, group = np.unique(key, return_inverse=True)
    n = len(groups)
    first = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first, group, start[narrow])
    last = np.zeros(n, np.int64)
    np.maximum.at(last, group, start[narrow] + duration[narrow])
    longest = np.full(n, -1, np.int64)
    np.maximum.at(longest, group, duration[narrow])
    dominant = np.zeros(n, kind.dtype)
    is_longest = duration[narrow] == longest[group]
    dominant[group[is_longest]] = kind[narrow][is_longest]
    merged = (
        first,
        last - first,
        np.full(n, row),
        dominant,
        groups // width,
        np.bincount(group, minlength=n),
    )
    kept = (start[wide], duration[wide], np.full(int(wide.sum()), row), kind[wide], depth[wide], ones[wide])
    columns = [np.concatenate([a, b]) for a, b in zip(kept, merged, strict=True)]
    order = np.argsort(columns[0], kind="stable")
    return tuple(c[order] for c in columns)  # type: ignore[return-value]
