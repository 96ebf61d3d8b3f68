"""What to change, read off an ``Analysis``, and the analysis as people read it: milliseconds,
seconds and shares rather than raw microsecond totals, and each hint with its evidence."""

from __future__ import annotations

import html
from typing import Protocol

import pandas as pd

__all__ = ["FIFTHS", "FULL", "duration", "hints", "render", "size", "summary"]

FIFTHS = ["0-20%", "20-40%", "40-60%", "60-80%", "80-100%"]  # per_phase's columns of the run's fifths


class Analysis(Protocol):
    """What the hints read (``analysis.Analysis`` has it; this module does not import it)."""

    per_activity: pd.DataFrame
    per_tensor: pd.DataFrame
    per_phase: pd.DataFrame
    stragglers: pd.DataFrame
    worst: pd.DataFrame
    negotiations: int
    ranked: int
    negotiation_us: int
    communication_us: int
    fusion_us: int
    wall_us: int
    cycles: int
    idle_cycles: int
    cycle_us: float
    fusion: pd.DataFrame
    fusion_threshold: int

    @property
    def communication_share(self) -> float: ...


MIN_NEGOTIATIONS = 10  # fewer is not a pattern
MIN_WAIT_US = 1_000  # a rank later by less than a millisecond keeps no one waiting
NEGOTIATION_HEAVY = 0.5  # negotiation's share of the time in collectives
MIN_CYCLES = 20
IDLE_CYCLES = 0.8  # share of cycles that start nothing
MIN_COLLECTIVES = 20
FULL_SHARE = 0.5  # share of collectives that (nearly) filled the fusion buffer
ALONE = 0.8  # share of collectives that carried one tensor
FULL = 0.8  # a collective that filled this share of the fusion buffer left no room for more


def duration(microseconds: float) -> str:
    """``1234567`` -> ``1.23 s``; ``12345`` -> ``12.3 ms``; ``12`` -> ``12 µs``."""
    if microseconds >= 1e6:
        return f"{microseconds / 1e6:.2f} s"
    if microseconds >= 1e3:
        return f"{microseconds / 1e3:.1f} ms"
    return f"{microseconds:.0f} µs"


def size(count: float) -> str:
    """``572`` -> ``572 B``; ``134217728`` -> ``128 MiB`` (Horovod counts its buffer in MiB)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def _straggler(analysis: Analysis) -> list[str]:
    frame = analysis.stragglers
    ranks = len(frame)
    if analysis.ranked < MIN_NEGOTIATIONS or ranks < 2:
        return []
    # with n ranks equally often last, each is last 1/n of the time; well above that is a pattern
    bar = max(0.6, 1.5 / ranks)
    found = []
    for rank, row in frame.iterrows():
        if row["share"] >= bar and row["mean wait"] >= MIN_WAIT_US:
            found.append(
                f"rank {rank}{_on(row)} was the last to be ready in {row['share']:.0%} of {analysis.ranked} "
                f"negotiations; the others waited {duration(row['mean wait'])} for it each time on "
                f"average ({duration(row['max wait'])} at most): check its input pipeline, its data "
                "shard's size and what else runs on its host"
            )
    return found


def _on(row: pd.Series) -> str:
    """' on hostB' where the analysis knows the rank's host."""
    host = row.get("host", "?")
    return f" on {host}" if host != "?" else ""


def _negotiation_heavy(analysis: Analysis) -> list[str]:
    collective = analysis.negotiation_us + analysis.communication_us
    if analysis.negotiations < MIN_NEGOTIATIONS or not collective:
        return []
    share = analysis.negotiation_us / collective
    if share < NEGOTIATION_HEAVY:
        return []
    return [
        f"negotiation took {share:.0%} of the time in collectives ({duration(analysis.negotiation_us)} "
        f"against {duration(analysis.communication_us)} moving data): the ranks reach each step at "
        "different times, so the time goes into waiting, not the network; even out their work "
        "(see the stragglers), or overlap it with HOROVOD_CYCLE_TIME and fusion"
    ]


def _cached(analysis: Analysis) -> list[str]:
    """Waiting that the response cache leaves unexplained: Horovod records which rank came last
    only in the negotiations it does not answer from the cache."""
    unranked = analysis.negotiations - analysis.ranked
    if unranked < MIN_NEGOTIATIONS or unranked < analysis.ranked or not _negotiation_heavy(analysis):
        return []
    return [
        f"{unranked} of {analysis.negotiations} negotiations were answered from Horovod's response "
        "cache, which does not record which rank was ready last: to name the rank the others wait "
        "for, run again with env=HOROVOD_CACHE_CAPACITY=0 (for the diagnosis; the cache makes "
        "training faster)"
    ]


def _idle_cycles(analysis: Analysis) -> list[str]:
    if analysis.cycles < MIN_CYCLES or analysis.idle_cycles / analysis.cycles < IDLE_CYCLES:
        return []
    return [
        f"{analysis.idle_cycles / analysis.cycles:.0%} of {analysis.cycles} cycles started no operation "
        f"(a cycle every {duration(analysis.cycle_us)}): raise HOROVOD_CYCLE_TIME (milliseconds) so that "
        "each cycle finds more tensors ready to fuse into one collective"
    ]


def _buffer_full(analysis: Analysis) -> list[str]:
    threshold, found = analysis.fusion_threshold, []
    for operation, row in analysis.fusion.iterrows() if threshold else ():
        if row["collectives"] >= MIN_COLLECTIVES and row["full"] >= FULL_SHARE:
            found.append(
                f"{row['full']:.0%} of {int(row['collectives'])} {operation} collectives filled the fusion "
                f"buffer to {FULL:.0%} or more (median {size(row['bytes p50'])} of {size(threshold)}): "
                "tensors ready together waited for the next collective; raise HOROVOD_FUSION_THRESHOLD "
                f"(bytes), e.g. env=HOROVOD_FUSION_THRESHOLD={2 * threshold}"
            )
    return found


def _unfused(analysis: Analysis) -> list[str]:
    """Many tensors, each in a collective of its own (HOROVOD_FUSION_THRESHOLD=0 means that)."""
    threshold, found = analysis.fusion_threshold, []
    for operation, row in analysis.fusion.iterrows() if threshold else ():
        small = not row["bytes p50"] >= threshold / 2  # unknown sizes count as small
        if row["collectives"] >= MIN_COLLECTIVES and row["distinct"] >= 2 and row["alone"] >= ALONE and small:
            median = "" if pd.isna(row["bytes p50"]) else f" (median {size(row['bytes p50'])})"
            found.append(
                f"{row['alone']:.0%} of {int(row['collectives'])} {operation} collectives carried a single "
                f"tensor{median}, though {int(row['distinct'])} tensors take part: each collective pays its "
                "own latency; raise HOROVOD_CYCLE_TIME (milliseconds) so that a cycle finds several "
                "tensors ready and fuses them"
            )
    return found


def hints(analysis: Analysis) -> list[str]:
    """Tuning hints, each with the evidence that fired it; none on a balanced timeline."""
    return (
        _straggler(analysis)
        + _negotiation_heavy(analysis)
        + _cached(analysis)
        + _idle_cycles(analysis)
        + _buffer_full(analysis)
        + _unfused(analysis)
    )


def _table(frame: pd.DataFrame, durations: tuple[str, ...], shares: tuple[str, ...] = ()) -> str:
    shown = frame.head(20).copy()
    for column in durations:
        shown[column] = shown[column].map(duration)
    for column in shares:
        shown[column] = shown[column].map(lambda v: f"{v:.0%}")
    return str(shown.to_html())


def _fusion_table(frame: pd.DataFrame) -> str:
    shown = frame.drop(columns=["distinct"]).copy()
    shown["tensors"] = shown["tensors"].map(lambda v: f"{v:.1f}")
    for column in ("bytes p50", "bytes max"):
        shown[column] = shown[column].map(lambda v: "?" if pd.isna(v) else size(v))
    for column in ("alone", "full"):
        shown[column] = shown[column].map(lambda v: "?" if pd.isna(v) else f"{v:.0%}")
    return str(shown.to_html())


def _ranked(analysis: Analysis) -> str:
    if analysis.ranked == analysis.negotiations:
        return f"{analysis.negotiations} negotiations"
    return (
        f"{analysis.ranked} of {analysis.negotiations} negotiations name their ranks, the others "
        "were answered from the response cache"
    )


def _headline(analysis: Analysis) -> str:
    return (
        f"{duration(analysis.wall_us)}, {analysis.cycles} cycles"
        + (f" ({analysis.idle_cycles} idle)" if analysis.cycles else "")
        + f"; negotiation {duration(analysis.negotiation_us)}, communication "
        f"{duration(analysis.communication_us)} ({analysis.communication_share:.0%} of the wall time), "
        f"fusion-buffer copies {duration(analysis.fusion_us)}"
    )


def summary(analysis: Analysis) -> str:
    """The analysis in a few lines of text, where its tables are not shown (a terminal, the
    text form of its display): the headline and the hints."""
    advice = [f"- {hint}" for hint in hints(analysis)] or ["no tuning hint: nothing stands out"]
    return "\n".join([f"Horovod Timeline: {_headline(analysis)}", *advice])


def render(analysis: Analysis) -> str:
    wall = analysis.wall_us or 1
    per_activity = analysis.per_activity.assign(share=analysis.per_activity["total"] / wall)
    advice = "".join(f"<li>{html.escape(hint)}</li>" for hint in hints(analysis))
    parts = [
        f"<b>Horovod Timeline</b>: {_headline(analysis)}",
        f"<br><b>what to change</b><ul>{advice}</ul>"
        if advice
        else "<br>no tuning hint: nothing stands out<br>",
        "<b>time per activity</b> (share: of the wall time, summed over tensors)",
        _table(per_activity, ("total", "mean"), ("share",)),
        "<b>time per phase</b> (p50, p95: one occurrence; 0-20% ...: its share in each fifth of the run)",
        _table(analysis.per_phase, ("total", "p50", "p95"), tuple(FIFTHS)),
        "<b>time per tensor</b> (top 20)",
        _table(analysis.per_tensor, ("total", "negotiation")),
        f"<b>last rank ready in a negotiation</b> (stragglers; {_ranked(analysis)})",
        _table(analysis.stragglers, ("mean wait", "max wait"), ("share",)),
    ]
    if not analysis.fusion.empty:
        parts += [
            f"<b>fusion</b> (tensors per collective; alone: collectives of one tensor; full: those that "
            f"filled {FULL:.0%} or more of the {size(analysis.fusion_threshold)} fusion buffer)",
            _fusion_table(analysis.fusion),
        ]
    if not analysis.worst.empty:
        parts += [
            "<b>longest waits</b> (at: since the first negotiation)",
            _table(analysis.worst, ("at", "wait")),
        ]
    return "".join(parts)
