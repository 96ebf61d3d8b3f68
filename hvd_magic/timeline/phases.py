"""Time per phase of a tensor's trip (negotiation, queue, ..., the collective), part of the
analysis: how much, how spread out, and when in the run."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hvd_magic.timeline.hints import FIFTHS
from hvd_magic.timeline.store import SpanStore

__all__ = ["PHASES", "phases"]

PHASES = {  # Horovod's activity names, by the phase of a tensor's trip they belong to
    "negotiation": ("NEGOTIATE_",),
    "queue": ("QUEUE",),
    "wait for data": ("WAIT_FOR_DATA", "WAIT_FOR_OTHER_TENSOR_DATA"),
    "fusion-buffer copies": ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER", "INIT_FUSION_BUFFER"),
    "collective": ("MPI_", "GLOO_", "NCCL_", "CCL_", "DDL_"),
}
CHUNK = 1 << 20  # spans taken at a time (bounds the scratch memory)


def phases(store: SpanStore) -> pd.DataFrame:
    """Time per phase, its spread (median and 95th percentile of one occurrence), and when in the
    run it was spent (its share in each fifth of the wall time, by start)."""
    columns = ["total", "count", "p50", "p95", *FIFTHS]
    phase_of_kind = np.full(len(store.kind_names), -1, np.int8)
    for number, prefixes in enumerate(PHASES.values()):
        phase_of_kind[store.kinds_where(prefixes) & (phase_of_kind < 0)] = number
    fifths, durations = _by_phase(store, phase_of_kind)
    rows = {}
    for number, label in enumerate(PHASES):
        duration = durations[number]
        if not len(duration):
            continue
        total = int(fifths[number].sum())
        p50, p95 = np.percentile(duration, [50, 95])
        rows[label] = [total, len(duration), float(p50), float(p95), *(fifths[number] / (total or 1))]
    if not rows:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    table.index.name = "phase"
    return table.sort_values("total", ascending=False)


def _by_phase(store: SpanStore, phase_of_kind: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per phase: its time in each fifth of the run (by start; exact while under 2^53 µs) and the
    durations of its spans, a piece at a time."""
    begin, wall = store.first_start, max(store.last_end - store.first_start, 1)
    fifths = np.zeros(len(PHASES) * 5)
    pieces: list[list[np.ndarray]] = [[] for _ in PHASES]
    for lo in range(0, len(store), CHUNK):
        phase = phase_of_kind[store.kind[lo : lo + CHUNK]]
        keep = phase >= 0
        phase, duration = phase[keep].astype(np.int64), store.duration[lo : lo + CHUNK][keep]
        fifth = ((store.start[lo : lo + CHUNK][keep] - begin) * 5 // wall).clip(0, 4)
        fifths += np.bincount(phase * 5 + fifth, weights=duration, minlength=len(fifths))
        for number, piece in enumerate(pieces):
            piece.append(duration[phase == number])
    durations = [np.concatenate(piece) if piece else np.empty(0, store.duration.dtype) for piece in pieces]
    return fifths.reshape(len(PHASES), 5), durations
