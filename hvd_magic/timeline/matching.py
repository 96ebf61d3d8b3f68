"""Spans from ``B``/``E`` pairs, matched without a Python loop.

Within one tensor (``pid``) spans nest properly, so a ``B`` at nesting level L is closed by the
next ``E`` back at level L; sorting by (tensor, level, order) lines each ``B`` up with its ``E``.
A truncated file leaves some ``B`` unmatched, and an ``E`` with nothing open is stray: both are
dropped. ``Timeline.spans()`` calls this once and keeps the frame.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["match_spans"]

COLUMNS = ["pid", "name", "start", "end", "duration", "depth"]


def match_spans(events: pa.Table, tensors: Mapping[int, str]) -> pd.DataFrame:
    """One row per activity: pid, name, start, end, duration (microseconds), depth, tensor."""
    phase = events["ph"].cast("string")
    marks = events.filter(pc.or_(pc.equal(phase, "B"), pc.equal(phase, "E")))
    is_begin = pc.equal(marks["ph"].cast("string"), "B").to_numpy(zero_copy_only=False)
    pid = marks["pid"].to_numpy(zero_copy_only=False).astype(np.int64)
    ts = marks["ts"].to_numpy(zero_copy_only=False).astype(np.int64)
    names = marks["name"].cast("string").to_numpy(zero_copy_only=False)
    if len(pid) == 0:
        return pd.DataFrame(columns=COLUMNS)
    order = np.argsort(pid, kind="stable")
    pid, ts, names, is_begin = pid[order], ts[order], names[order], is_begin[order]
    level = _levels(pid, is_begin)
    b, e = _pairs(pid, is_begin, level)
    frame = pd.DataFrame({"pid": pid[b], "name": names[b], "start": ts[b], "end": ts[e], "depth": level[b]})
    frame["duration"] = frame["end"] - frame["start"]
    frame["tensor"] = frame["pid"].map(tensors)
    return frame.sort_values(["start", "pid"]).reset_index(drop=True)


def _levels(pid: np.ndarray, is_begin: np.ndarray) -> np.ndarray:
    """The nesting level of each event (grouped by tensor, in order); -1 for a stray ``E``.

    The nesting depth after each event, per tensor, ignoring an ``E`` with nothing open, is the
    running sum S restarted at each tensor, less its running minimum below 0. Shifting each
    tensor's sums below all earlier ones keeps one minimum.accumulate for all tensors.
    """
    running = np.cumsum(np.where(is_begin, 1, -1))
    starts = np.r_[0, np.flatnonzero(np.diff(pid)) + 1]
    sizes = np.diff(np.r_[starts, len(pid)])
    running -= np.repeat(np.r_[0, running[starts[1:] - 1]], sizes)
    shift = np.repeat(np.arange(len(starts), dtype=np.int64) * (2 * len(pid) + 2), sizes)
    floor = np.minimum(np.minimum.accumulate(running - shift) + shift, 0)
    depth_after = running - floor
    depth_before = np.r_[0, depth_after[:-1]]
    depth_before[starts] = 0
    stray = ~is_begin & (depth_before == 0)
    return np.where(is_begin, depth_after - 1, np.where(stray, -1, depth_after))


def _pairs(pid: np.ndarray, is_begin: np.ndarray, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indexes of the ``B`` and the ``E`` of each span: within each (tensor, level) group, in
    order, the k-th ``B`` pairs with the k-th ``E``; a ``B`` without its ``E`` is dropped."""
    index = np.flatnonzero(level >= 0)
    ordered = index[np.lexsort((index, level[index], pid[index]))]
    begin = is_begin[ordered]
    new_group = np.r_[True, (np.diff(pid[ordered]) != 0) | (np.diff(level[ordered]) != 0)]
    group = np.cumsum(new_group) - 1
    group_start = np.flatnonzero(new_group)
    nth = np.empty(len(ordered), dtype=np.int64)
    for mask in (begin, ~begin):
        running = np.cumsum(mask)
        nth[mask] = (running - np.r_[0, running[:-1]][group_start][group])[mask] - 1
    pairs = np.minimum(np.bincount(group, weights=begin), np.bincount(group, weights=~begin))
    kept = nth < pairs[group]
    return ordered[kept & begin], ordered[kept & ~begin]
