"""What a Horovod Timeline says: where the time went, who kept the others waiting."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .hints import FIFTHS, FULL, hints, render
from .reader import Timeline
from .store import SpanStore

__all__ = ["Analysis", "analyze", "fusion_threshold", "spans"]

COMMUNICATION = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")
DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024  # Horovod 0.28's HOROVOD_FUSION_THRESHOLD


def spans(timeline: Timeline) -> pd.DataFrame:
    """One row per activity: tensor pid, name, start, end, duration (microseconds), depth.

    >>> spans(hvd_magic.timeline.read("timeline.json")).groupby("name")["duration"].sum()  # doctest: +SKIP

    Computed once per timeline (``Timeline.spans()``); treat the frame as read-only.
    """
    return timeline.spans()


@dataclass
class Analysis:
    per_activity: pd.DataFrame  # activity -> total, count, mean (us)
    per_tensor: pd.DataFrame  # tensor -> total us of its top-level spans, negotiation wait, bytes
    per_phase: pd.DataFrame  # phase -> total, count, p50, p95, and its share in each fifth of the run
    stragglers: pd.DataFrame  # rank -> times last ready in a negotiation, share, the others' wait
    worst: pd.DataFrame  # the negotiations the others waited longest in: tensor, at, last rank, wait
    negotiations: int  # NEGOTIATE_* spans
    ranked: int  # of them, those whose ``X`` marks name the ranks (not answered from the cache)
    negotiation_us: int
    communication_us: int
    fusion_us: int
    wall_us: int
    cycles: int
    idle_cycles: int  # cycles in which no operation started (timeline=cycles)
    cycle_us: float  # the median time between two cycles' starts
    fusion: pd.DataFrame  # operation -> collectives, tensors per collective, bytes, buffer use
    fusion_threshold: int  # the fusion buffer's size the run had (bytes)

    @property
    def communication_share(self) -> float:
        return self.communication_us / self.wall_us if self.wall_us else 0.0

    @property
    def hints(self) -> list[str]:
        """What to change, each with its evidence (``timeline.hints``)."""
        return hints(self)

    def to_html(self) -> str:
        return render(self)


def fusion_threshold(env: Mapping[str, str] | None = None) -> int:
    """The fusion buffer's size in bytes: HOROVOD_FUSION_THRESHOLD in ``env`` (the run's), else
    in this process's environment, else Horovod's default."""
    for source in (env or {}, os.environ):
        value = source.get("HOROVOD_FUSION_THRESHOLD", "").strip()
        if value.isdigit():
            return int(value)
    return DEFAULT_FUSION_THRESHOLD


def analyze(timeline: Timeline, threshold: int | None = None) -> Analysis:
    """Time per activity and per tensor, negotiation waits, stragglers, fusion (against the
    run's fusion buffer, ``threshold`` bytes: see :func:`fusion_threshold`), communication."""
    store = timeline.store
    kind, depth, duration = store.kind, store.depth, store.duration
    top = depth == 0
    negotiate = store.kinds_where("NEGOTIATE")
    negotiation = top & negotiate[kind]
    kinds, rows = len(store.kind_names), len(store.row_names)
    per_activity = pd.DataFrame(
        {
            "total": np.bincount(kind, weights=duration, minlength=kinds).astype(np.int64),
            "count": np.bincount(kind, minlength=kinds),
        },
        index=pd.Index(store.kind_names, name="name"),
    )
    per_activity["mean"] = per_activity["total"] / per_activity["count"].where(per_activity["count"] > 0, 1)
    per_activity = per_activity[per_activity["count"] > 0].sort_values("total", ascending=False)
    named = [i for i, tensor in enumerate(store.row_tensors) if tensor is not None]
    per_tensor = (
        pd.DataFrame(
            {
                "total": np.bincount(store.row[top], weights=duration[top], minlength=rows)[named],
                "negotiation": np.bincount(
                    store.row[negotiation], weights=duration[negotiation], minlength=rows
                )[named],
            },
            index=pd.Index([store.row_tensors[i] for i in named], name="tensor"),
        )
        .astype(np.int64)
        .groupby(level=0)
        .sum()
        .sort_values("total", ascending=False)
    )
    communication = (depth > 0) & store.kinds_where(COMMUNICATION, contains=True)[kind]
    fusion = store.kinds_where("FUSION_BUFFER", contains=True)[kind]
    wall = int(store.end.max() - store.start.min()) if len(store) else 0
    return Analysis(
        per_activity=per_activity,
        per_tensor=per_tensor,
        per_phase=_phases(store),
        **_readiness(store, int(negotiation.sum()), store.start[negotiation]),
        negotiation_us=int(duration[negotiation].sum()),
        communication_us=int(duration[communication].sum()),
        fusion_us=int(duration[fusion].sum()),
        wall_us=wall,
        **_cycles(store.cycles, store.start[top & ~negotiate[kind]]),
        **_fusion(store, top & ~negotiate[kind], fusion_threshold() if threshold is None else threshold),
    )


def _fusion(store: SpanStore, top_level: np.ndarray, threshold: int) -> dict[str, Any]:
    """Per operation (ALLREDUCE, ...): its collectives and how many tensors each fused.

    Horovod starts the operation of every tensor in a fused collective before it ends any, and
    runs one collective after the other: a tensor's operation that starts before the previous
    one (by start) ended is in the same collective.
    """
    columns = ["collectives", "tensors", "most tensors", "alone", "distinct"]
    columns += ["bytes p50", "bytes max", "full"]
    operation = top_level & store.kinds_where(COMMUNICATION, contains=True)[store.kind]
    chosen = np.flatnonzero(operation)
    if not len(chosen):
        return {"fusion": pd.DataFrame(columns=columns), "fusion_threshold": threshold}
    chosen = chosen[np.lexsort((store.start[chosen], store.kind[chosen]))]
    kind, start = store.kind[chosen], store.start[chosen]
    end = start + store.duration[chosen]
    first = np.flatnonzero(np.r_[True, (kind[1:] != kind[:-1]) | (start[1:] >= end[:-1])])
    tensors = np.diff(np.r_[first, len(chosen)])
    sizes = store.row_bytes[store.row[chosen]]
    payload = np.add.reduceat(sizes, first)
    known = np.add.reduceat((sizes == 0).astype(np.int64), first) == 0
    rows = {}
    for k in np.unique(kind[first]).tolist():
        mine = kind[first] == k
        measured = payload[mine & known]
        rows[store.kind_names[k]] = [
            int(mine.sum()),
            float(tensors[mine].mean()),
            int(tensors[mine].max()),
            float((tensors[mine] == 1).mean()),
            len(np.unique(store.row[chosen][kind == k])),
            float(np.median(measured)) if len(measured) else np.nan,
            float(measured.max()) if len(measured) else np.nan,
            float((measured >= FULL * threshold).mean()) if len(measured) and threshold else np.nan,
        ]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    table.index.name = "operation"
    return {"fusion": table.sort_values("collectives", ascending=False), "fusion_threshold": threshold}


def _cycles(marks: np.ndarray, operations: np.ndarray) -> dict[str, Any]:
    """With ``timeline=cycles``: how many of Horovod's background cycles started no operation."""
    if len(marks) < 2:
        return {"cycles": len(marks), "idle_cycles": 0, "cycle_us": 0.0}
    # the cycle an operation starts in: the last mark at or before it
    busy = np.unique(np.searchsorted(marks, operations, side="right") - 1)
    busy = busy[busy >= 0]
    return {
        "cycles": len(marks),
        "idle_cycles": len(marks) - len(busy),
        "cycle_us": float(np.median(np.diff(marks))),
    }


PHASES = {  # Horovod's activity names, by the phase of a tensor's trip they belong to
    "negotiation": ("NEGOTIATE_",),
    "queue": ("QUEUE",),
    "wait for data": ("WAIT_FOR_DATA", "WAIT_FOR_OTHER_TENSOR_DATA"),
    "fusion-buffer copies": ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER", "INIT_FUSION_BUFFER"),
    "collective": ("MPI_", "GLOO_", "NCCL_", "CCL_", "DDL_"),
}


def _phases(store: SpanStore) -> pd.DataFrame:
    """Time per phase, its spread (median and 95th percentile of one occurrence), and when in the
    run it was spent (its share in each fifth of the wall time, by start)."""
    columns = ["total", "count", "p50", "p95", *FIFTHS]
    phase_of_kind = np.full(len(store.kind_names), -1)
    for number, prefixes in enumerate(PHASES.values()):
        phase_of_kind[store.kinds_where(prefixes) & (phase_of_kind < 0)] = number
    phase = phase_of_kind[store.kind] if len(store) else np.empty(0, np.int64)
    if not (phase >= 0).any():
        return pd.DataFrame(columns=columns)
    begin, wall = int(store.start.min()), max(int(store.end.max() - store.start.min()), 1)
    rows = {}
    for number, label in enumerate(PHASES):
        mine = phase == number
        if not mine.any():
            continue
        duration = store.duration[mine]
        fifth = ((store.start[mine] - begin) * 5 // wall).clip(0, 4)
        total = int(duration.sum())
        spread = np.bincount(fifth, weights=duration, minlength=5) / (total or 1)
        p50, p95 = np.percentile(duration, [50, 95])
        rows[label] = [total, len(duration), float(p50), float(p95), *spread]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    table.index.name = "phase"
    return table.sort_values("total", ascending=False)


def _readiness(store: SpanStore, negotiations: int, negotiation_starts: np.ndarray) -> dict[str, Any]:
    """In each top-level NEGOTIATE_* span, the last rank-ready mark names the rank the others
    waited for, for the time since the mark before it. Negotiations that Horovod answers from
    its response cache (every step after the first, by default) carry no marks: they count in
    ``negotiations``, not in ``ranked``."""
    empty = pd.DataFrame({"times last": [], "share": [], "mean wait": [], "max wait": []})
    mine = (store.ready_depth == 0) & store.kinds_where("NEGOTIATE")[store.ready_kind]
    if not mine.any():
        return {"stragglers": empty, "worst": pd.DataFrame(), "negotiations": negotiations, "ranked": 0}
    last = pd.DataFrame(
        {
            "row": store.ready_row[mine],
            "start": store.ready_start[mine],
            "name": np.asarray(store.ready_rank, dtype=object)[mine],
            "wait": store.ready_wait[mine],
        }
    )
    by_rank = last.groupby("name")["wait"]
    stragglers = pd.DataFrame(
        {"times last": by_rank.size(), "mean wait": by_rank.mean(), "max wait": by_rank.max()}
    )
    # every rank that marked readiness has a row, also one that was never last
    ranks = sorted(set(store.ranks) | set(stragglers.index), key=lambda name: (len(name), name))
    stragglers = stragglers.reindex(ranks).fillna({"times last": 0, "mean wait": 0.0, "max wait": 0})
    stragglers["times last"] = stragglers["times last"].astype(int)
    stragglers.insert(1, "share", stragglers["times last"] / len(last))
    stragglers.index = stragglers.index.rename("rank")
    worst = last.nlargest(5, "wait")
    worst = pd.DataFrame(
        {
            "tensor": [store.row_names[r] for r in worst["row"]],
            "at": worst["start"].to_numpy() - negotiation_starts.min(),
            "last rank": worst["name"].to_numpy(),
            "wait": worst["wait"].to_numpy(),
        }
    )
    return {
        "stragglers": stragglers.sort_values("times last", ascending=False, kind="stable"),
        "worst": worst,
        "negotiations": negotiations,
        "ranked": len(last),
    }
