"""What a Horovod Timeline says: where the time went, who kept the others waiting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from .hints import FIFTHS, hints, render
from .reader import Timeline

__all__ = ["Analysis", "analyze", "spans"]

COMMUNICATION = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")


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

    @property
    def communication_share(self) -> float:
        return self.communication_us / self.wall_us if self.wall_us else 0.0

    @property
    def hints(self) -> list[str]:
        """What to change, each with its evidence (``timeline.hints``)."""
        return hints(self)

    def to_html(self) -> str:
        return render(self)


def analyze(timeline: Timeline) -> Analysis:
    """Time per activity and per tensor, negotiation waits, stragglers, fusion, communication."""
    frame = spans(timeline)
    per_activity = (
        frame.groupby("name")["duration"]
        .agg(total="sum", count="size", mean="mean")
        .sort_values("total", ascending=False)
    )
    top = frame[frame["depth"] == 0]
    negotiation = top[top["name"].str.startswith("NEGOTIATE")]
    per_tensor = (
        pd.DataFrame(
            {
                "total": top.groupby("tensor")["duration"].sum(),
                "negotiation": negotiation.groupby("tensor")["duration"].sum(),
            }
        )
        .fillna(0)
        .sort_values("total", ascending=False)
    )
    communication = frame[frame["name"].str.contains("|".join(COMMUNICATION)) & (frame["depth"] > 0)]
    fusion = frame[frame["name"].str.contains("FUSION_BUFFER")]
    wall = int(frame["end"].max() - frame["start"].min()) if len(frame) else 0
    return Analysis(
        per_activity=per_activity,
        per_tensor=per_tensor,
        per_phase=_phases(frame),
        **_readiness(timeline, negotiation),
        negotiation_us=int(negotiation["duration"].sum()),
        communication_us=int(communication["duration"].sum()),
        fusion_us=int(fusion["duration"].sum()),
        wall_us=wall,
        **_cycles(timeline, top[~top["name"].str.startswith("NEGOTIATE")]),
    )


def _cycles(timeline: Timeline, operations: pd.DataFrame) -> dict[str, Any]:
    """With ``timeline=cycles``: how many of Horovod's background cycles started no operation."""
    events = timeline.events
    marks = events.filter(pc.equal(events["name"].cast("string"), "CYCLE_START"))["ts"].to_numpy()
    marks = np.sort(marks)
    if len(marks) < 2:
        return {"cycles": len(marks), "idle_cycles": 0, "cycle_us": 0.0}
    # the cycle an operation starts in: the last mark at or before it
    busy = np.unique(np.searchsorted(marks, operations["start"].to_numpy(), side="right") - 1)
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


def _phases(frame: pd.DataFrame) -> pd.DataFrame:
    """Time per phase, its spread (median and 95th percentile of one occurrence), and when in the
    run it was spent (its share in each fifth of the wall time, by start)."""
    columns = ["total", "count", "p50", "p95", *FIFTHS]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    names = frame["name"].astype(str)
    phase = pd.Series(None, index=frame.index, dtype=object)
    for label, prefixes in PHASES.items():
        phase[names.str.startswith(prefixes) & phase.isna()] = label
    known = frame.assign(phase=phase).dropna(subset=["phase"])
    start, wall = frame["start"].min(), max(int(frame["end"].max() - frame["start"].min()), 1)
    fifth = ((known["start"] - start) * 5 // wall).clip(0, 4).astype(int)
    by_phase = known.groupby("phase")["duration"]
    table = by_phase.agg(total="sum", count="size", p50="median", p95=lambda d: d.quantile(0.95))
    spread = known.assign(fifth=fifth).pivot_table("duration", "phase", "fifth", aggfunc="sum", fill_value=0)
    spread = spread.reindex(columns=range(5), fill_value=0).div(
        table["total"].where(table["total"] > 0, 1), axis=0
    )
    spread.columns = FIFTHS
    return table.join(spread).sort_values("total", ascending=False)[columns]


def _readiness(timeline: Timeline, negotiation: pd.DataFrame) -> dict[str, Any]:
    """Inside each NEGOTIATE_* span, the ``X`` marks name the ranks as they become ready: the
    last one kept the others waiting, for the time since the mark before it. Negotiations that
    Horovod answers from its response cache (every step after the first, by default) carry no
    marks: they count in ``negotiations``, not in ``ranked``."""
    events = timeline.events
    marks = (
        events.filter(pc.equal(events["ph"].cast("string"), "X")).select(["name", "ts", "pid"]).to_pandas()
    )
    empty = pd.DataFrame({"times last": [], "share": [], "mean wait": [], "max wait": []})
    if marks.empty or negotiation.empty:
        return {"stragglers": empty, "worst": pd.DataFrame(), "negotiations": len(negotiation), "ranked": 0}
    marks["name"] = marks["name"].astype(str)
    spans_by_pid = negotiation[["pid", "tensor", "start", "end"]].sort_values("start")
    merged = pd.merge_asof(marks.sort_values("ts"), spans_by_pid, left_on="ts", right_on="start", by="pid")
    merged = merged[merged["ts"] <= merged["end"]].sort_values("ts")
    groups = merged.groupby(["pid", "start"])
    last = groups.tail(1).set_index(["pid", "start"])
    before = groups.nth(-2).set_index(["pid", "start"])["ts"]  # negotiations with a single mark: no wait
    last["wait"] = (last["ts"] - before.reindex(last.index)).fillna(0)
    by_rank = last.groupby("name")["wait"]
    stragglers = pd.DataFrame(
        {"times last": by_rank.size(), "mean wait": by_rank.mean(), "max wait": by_rank.max()}
    )
    # every rank that marked readiness has a row, also one that was never last
    ranks = sorted(merged["name"].unique(), key=lambda name: (len(name), name))
    stragglers = stragglers.reindex(ranks).fillna({"times last": 0, "mean wait": 0.0, "max wait": 0})
    stragglers["times last"] = stragglers["times last"].astype(int)
    stragglers.insert(1, "share", stragglers["times last"] / len(last))
    stragglers.index = stragglers.index.rename("rank")
    worst = last.nlargest(5, "wait").reset_index()[["tensor", "start", "name", "wait"]]
    worst.columns = ["tensor", "at", "last rank", "wait"]
    worst["at"] -= negotiation["start"].min()
    return {
        "stragglers": stragglers.sort_values("times last", ascending=False),
        "worst": worst,
        "negotiations": len(negotiation),
        "ranked": len(last),
    }
