"""What a timeline says (hvd_magic.timeline.analysis) about real mpi and gloo runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hvd_magic.timeline import analyze, read, spans

from .timeline_fixtures import real_timelines

__all__ = ["real_timelines"]  # a fixture, used by name


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_real_timeline_parses_and_analyses(real_timelines: dict[str, Path], launcher: str) -> None:
    timeline = read(real_timelines[launcher])
    assert timeline.closed and not timeline.truncated
    assert set(timeline.tensors.values()) == {"allreduce.weight", "allreduce.bias"}
    frame = spans(timeline)
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= set(frame["name"])
    assert (frame["duration"] >= 0).all() and (frame["end"] >= frame["start"]).all()
    inner = set(frame[frame["depth"] > 0]["name"])
    assert any(name.endswith("ALLREDUCE") for name in inner)  # MPI_ALLREDUCE or GLOO_ALLREDUCE
    analysis = analyze(timeline)
    assert analysis.per_activity.loc["ALLREDUCE", "count"] == frame["name"].eq("ALLREDUCE").sum()
    assert set(analysis.stragglers.index) <= {"0", "1"} and analysis.stragglers["times last"].sum() > 0
    assert analysis.stragglers["times last"].sum() == analysis.ranked <= analysis.negotiations
    assert "time per activity" in analysis.to_html()
    assert set(analysis.per_activity.index) == set(frame["name"])
    assert analysis.per_activity["total"].sum() == frame["duration"].sum()
    assert set(analysis.per_tensor.index) == {"allreduce.weight", "allreduce.bias"}
    top = frame[frame["depth"] == 0]
    negotiation = top[top["name"].str.startswith("NEGOTIATE")]["duration"].sum()
    assert analysis.negotiation_us == negotiation == analysis.per_tensor["negotiation"].sum() > 0
    assert analysis.communication_us > 0 and analysis.fusion_us >= 0
    assert analysis.wall_us == frame["end"].max() - frame["start"].min() > 0
    html = analysis.to_html()
    assert all(name in html for name in frame["name"].unique()) and "allreduce.weight" in html
