"""What a Horovod Timeline says: where the time went, who kept the others waiting."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from hvd_magic.timeline.hints import FULL, hints, render
from hvd_magic.timeline.matching import release_memory
from hvd_magic.timeline.phases import phases
from hvd_magic.timeline.reader import Timeline
from hvd_magic.timeline.store import SpanStore

__all__ = ["Analysis", "analyze", "fusion_threshold", "spans"]

COMMUNICATION = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")
DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024  # Horovod 0.28's HOROVOD_FUSION_THRESHOLD
CHUNK = 1 << 20  # spans summed at a time (bounds the scratch memory)


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


def analyze(
    timeline: Timeline, threshold: int | None = None, hosts: Mapping[int, str] | None = None
) -> Analysis:
    """Time per activity and per tensor, negotiation waits, stragglers, fusion (against the
    run's fusion buffer, ``threshold`` bytes: see :func:`fusion_threshold`), communication.
    ``hosts``: each rank's host (the run's), named beside the rank in stragglers and waits."""
    store = timeline.store
    kind, depth, duration = store.kind, store.depth, store.duration
    top = depth == 0
    negotiate = store.kinds_where("NEGOTIATE")
    negotiation = top & negotiate[kind]
    kinds, rows = len(store.kind_names), len(store.row_names)
    per_activity = pd.DataFrame(
        {"total": _totals(kind, duration, kinds), "count": _totals(kind, None, kinds)},
        index=pd.Index(store.kind_names, name="name"),
    )
    per_activity["mean"] = per_activity["total"] / per_activity["count"].where(per_activity["count"] > 0, 1)
    per_activity = per_activity[per_activity["count"] > 0].sort_values("total", ascending=False)
    named = [i for i, tensor in enumerate(store.row_tensors) if tensor is not None]
    per_tensor = (
        pd.DataFrame(
            {
                "total": _totals(store.row, duration, rows, top)[named],
                "negotiation": _totals(store.row, duration, rows, negotiation)[named],
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
    wall = store.last_end - store.first_start
    analysis = Analysis(
        per_activity=per_activity,
        per_tensor=per_tensor,
        per_phase=phases(store),
        **_readiness(store, int(negotiation.sum()), store.start[negotiation]),
        negotiation_us=int(duration[negotiation].sum()),
        communication_us=int(duration[communication].sum()),
        fusion_us=int(duration[fusion].sum()),
        wall_us=wall,
        **_cycles(store, top & ~negotiate[kind]),
        **_fusion(store, top & ~negotiate[kind], fusion_threshold() if threshold is None else threshold),
    )
    release_memory()  # what the sums over every span freed
    _name_hosts(analysis, hosts or {})
    return analysis


def _name_hosts(analysis: Analysis, hosts: Mapping[int, str]) -> None:
    """A host column beside the ranks (the timeline itself names ranks only), if known."""
    if not hosts:
        return

    def host(rank: object) -> str:
        return hosts.get(int(str(rank)), "?") if str(rank).isdigit() else "?"

    analysis.stragglers.insert(0, "host", [host(rank) for rank in analysis.stragglers.index])
    if not analysis.worst.empty:
        analysis.worst.insert(3, "host", [host(rank) for rank in analysis.worst["last rank"]])


def _totals(
    index: np.ndarray, weights: np.ndarray | None, length: int, where: np.ndarray | None = None
) -> np.ndarray:
    """``weights`` (None: ones) summed by ``index`` where ``where``, a piece at a time: no
    64-bit copy of a column as long as the timeline."""
    total = np.zeros(length)
    for lo in range(0, len(index), CHUNK):
        piece = slice(lo, lo + CHUNK)
        keep = slice(None) if where is None else where[piece]
        some = None if weights is None else weights[piece][keep]
        total += np.bincount(index[piece][keep], weights=some, minlength=length)
    return total.astype(np.int64)


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


def _cycles(store: SpanStore, operations: np.ndarray) -> dict[str, Any]:
    """With ``timeline=cycles``: how many of Horovod's background cycles started no operation
    (``operations``: which spans are operations)."""
    marks = store.cycles
    if len(marks) < 2:
        return {"cycles": len(marks), "idle_cycles": 0, "cycle_us": 0.0}
    busy = np.zeros(len(marks), bool)
    for lo in range(0, len(store), CHUNK):
        starts = store.start[lo : lo + CHUNK][operations[lo : lo + CHUNK]]
        # the cycle an operation starts in: the last mark at or before it
        cycle = np.searchsorted(marks, starts, side="right") - 1
        busy[cycle[cycle >= 0]] = True
    return {
        "cycles": len(marks),
        "idle_cycles": len(marks) - int(busy.sum()),
        "cycle_us": float(np.median(np.diff(marks))),
    }


def _readiness(store: SpanStore, negotiations: int, negotiation_starts: np.ndarray) -> dict[str, Any]:
    """In each top-level NEGOTIATE_* span, the last rank-ready mark names the rank the others
    waited for, for the time since the mark before it. Negotiations that Horovod answers from
    its response cache (every step after the first, by default) carry no marks: they count in
    ``negotiations``, not in ``ranked``."""
    empty = pd.DataFrame({"times last": [], "share": [], "mean wait": [], "max wait": []})
    mine = (store.ready_depth == 0) & store.kinds_where("NEGOTIATE")[store.ready_kind]
    if not mine.any():
        return {"stragglers": empty, "worst": pd.DataFrame(), "negotiations": negotiations, "ranked": 0}
    labels = [*store.ranks, "?"]  # "?": a mark without a name
    rank = store.ready_rank[mine]
    rank = np.where(rank < 0, len(store.ranks), rank)
    wait = store.ready_wait[mine]
    return {
        "stragglers": _stragglers(labels, rank, wait),
        "worst": _worst(store, labels, np.flatnonzero(mine), rank, negotiation_starts.min()),
        "negotiations": negotiations,
        "ranked": len(rank),
    }


def _stragglers(labels: list[str], rank: np.ndarray, wait: np.ndarray) -> pd.DataFrame:
    """Per rank (every rank that marked readiness, also one never last): how often it was last,
    the share of negotiations, the others' mean and longest wait for it."""
    times = np.bincount(rank, minlength=len(labels))
    longest = np.zeros(len(labels), np.int64)
    np.maximum.at(longest, rank, wait)
    mean = np.bincount(rank, weights=wait, minlength=len(labels)) / np.maximum(times, 1)
    shown = [i for i in range(len(labels)) if i < len(labels) - 1 or times[i]]
    shown.sort(key=lambda i: (len(labels[i]), labels[i]))
    stragglers = pd.DataFrame(
        {"times last": times[shown], "share": times[shown] / len(rank), "mean wait": mean[shown],
         "max wait": longest[shown]},
        index=pd.Index([labels[i] for i in shown], name="rank"),
    )  # fmt: skip
    return stragglers.sort_values("times last", ascending=False, kind="stable")


def _worst(
    store: SpanStore, labels: list[str], index: np.ndarray, rank: np.ndarray, began: int
) -> pd.DataFrame:
    """The five longest waits (ties: the earlier first): which tensor, when, which rank was last."""
    wait = store.ready_wait[index]
    count = min(5, len(wait))
    floor = np.partition(wait, len(wait) - count)[len(wait) - count]
    candidates = np.flatnonzero(wait >= floor)
    top = candidates[np.argsort(-wait[candidates], kind="stable")][:count]
    return pd.DataFrame(
        {
            "tensor": [store.row_names[r] for r in store.ready_row[index[top]]],
            "at": store.ready_start[index[top]] - began,
            "last rank": [labels[r] for r in rank[top]],
            "wait": wait[top],
        }
    )
