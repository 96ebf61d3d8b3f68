"""What a Horovod Timeline says: where the time went, who kept the others waiting.

Spans come from ``B``/``E`` pairs, matched without a Python loop: within one tensor (``pid``)
spans nest properly, so a ``B`` at nesting level L is closed by the next ``E`` back at level L;
sorting by (tensor, level, order) lines each ``B`` up with its ``E``. A truncated file leaves
some ``B`` unmatched: they are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from .parse import Timeline

__all__ = ["Analysis", "analyze", "spans"]

COMMUNICATION = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")


def spans(timeline: Timeline) -> pd.DataFrame:
    """One row per activity: tensor pid, name, start, end, duration (microseconds), depth.

    Computed once per timeline; treat the frame as read-only.
    """
    if timeline._spans is None:
        timeline._spans = _match_spans(timeline)
    return timeline._spans


def _match_spans(timeline: Timeline) -> pd.DataFrame:
    events = timeline.events
    phase = events["ph"].cast("string")
    keep = pc.or_(pc.equal(phase, "B"), pc.equal(phase, "E"))
    be = events.filter(keep).select(["ph", "name", "ts", "pid"])
    is_begin = pc.equal(be["ph"].cast("string"), "B").to_numpy(zero_copy_only=False)
    pid = be["pid"].to_numpy(zero_copy_only=False).astype(np.int64)
    ts = be["ts"].to_numpy(zero_copy_only=False).astype(np.int64)
    names = be["name"].cast("string").to_numpy(zero_copy_only=False)
    if len(pid) == 0:
        return pd.DataFrame(columns=["pid", "name", "start", "end", "duration", "depth"])
    order = np.argsort(pid, kind="stable")
    pid, ts, names, is_begin = pid[order], ts[order], names[order], is_begin[order]
    # Nesting depth after each event, per tensor, where an E with nothing open (a stray end)
    # is ignored: the running sum S restarted at each tensor, less its running minimum below 0.
    # Shifting each tensor's sums below all earlier ones keeps one minimum.accumulate per tensor.
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
    level = np.where(is_begin, depth_after - 1, np.where(stray, -1, depth_after))
    index = np.flatnonzero(level >= 0)
    ordered = index[np.lexsort((index, level[index], pid[index]))]
    # Within each (tensor, depth) group, in time order, the k-th B pairs with the k-th E.
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
    b, e = ordered[kept & begin], ordered[kept & ~begin]
    frame = pd.DataFrame({"pid": pid[b], "name": names[b], "start": ts[b], "end": ts[e], "depth": level[b]})
    frame["duration"] = frame["end"] - frame["start"]
    frame["tensor"] = frame["pid"].map(timeline.tensors)
    return frame.sort_values(["start", "pid"]).reset_index(drop=True)


@dataclass
class Analysis:
    per_activity: pd.DataFrame  # activity -> total, count, mean (us)
    per_tensor: pd.DataFrame  # tensor -> total us of its top-level spans, negotiation wait, bytes
    last_ready: pd.DataFrame  # rank -> how often it was the last one ready in a negotiation
    negotiation_us: int
    communication_us: int
    fusion_us: int
    wall_us: int
    cycles: int

    @property
    def communication_share(self) -> float:
        return self.communication_us / self.wall_us if self.wall_us else 0.0

    def to_html(self) -> str:
        def table(frame: pd.DataFrame) -> str:
            return str(frame.head(20).to_html(float_format=lambda v: f"{v:,.0f}"))

        lines = [
            f"<b>Horovod Timeline</b>: {self.wall_us / 1e6:.2f} s, {self.cycles} cycles; "
            f"negotiation {self.negotiation_us / 1e6:.3f} s, communication "
            f"{self.communication_us / 1e6:.3f} s ({self.communication_share:.0%} of the wall time), "
            f"fusion-buffer copies {self.fusion_us / 1e6:.3f} s",
            "<br><b>time per activity</b> (microseconds)",
            table(self.per_activity),
            "<b>time per tensor</b> (microseconds, top 20)",
            table(self.per_tensor),
            "<b>last rank ready in a negotiation</b> (stragglers)",
            self.last_ready.to_html(),
        ]
        return "".join(lines)


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
        last_ready=_last_ready(timeline, negotiation),
        negotiation_us=int(negotiation["duration"].sum()),
        communication_us=int(communication["duration"].sum()),
        fusion_us=int(fusion["duration"].sum()),
        wall_us=wall,
        cycles=int(pc.sum(pc.equal(timeline.events["name"].cast("string"), "CYCLE_START")).as_py() or 0),
    )


def _last_ready(timeline: Timeline, negotiation: pd.DataFrame) -> pd.DataFrame:
    """Inside each NEGOTIATE_* span, the ``X`` marks name the ranks as they become ready."""
    events = timeline.events
    marks = (
        events.filter(pc.equal(events["ph"].cast("string"), "X")).select(["name", "ts", "pid"]).to_pandas()
    )
    if marks.empty or negotiation.empty:
        return pd.DataFrame({"times last": []})
    marks["name"] = marks["name"].astype(str)
    spans_by_pid = negotiation[["pid", "start", "end"]].sort_values(["pid", "start"])
    merged = pd.merge_asof(
        marks.sort_values("ts"), spans_by_pid.sort_values("start"), left_on="ts", right_on="start", by="pid"
    )
    merged = merged[merged["ts"] <= merged["end"]]
    last = merged.sort_values("ts").groupby(["pid", "start"]).tail(1)
    counts = last.groupby("name").size().rename("times last").sort_values(ascending=False)
    counts.index = counts.index.rename("rank")
    return counts.to_frame()
