"""What a Horovod Timeline says: where the time went, who kept the others waiting."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pyarrow.compute as pc

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
