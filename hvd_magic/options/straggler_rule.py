"""``stragglers=``: the rule a straggler is judged by, and its spelling (pure; the watch that
applies it is ``run.stragglers``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StragglerRule", "parse_rule"]

_OFF = ("off", "no", "false", "0")
_ON = ("on", "yes", "true")


@dataclass(frozen=True)
class StragglerRule:
    """A rank below ``fraction`` of the median steps/s for ``seconds`` is a straggler."""

    fraction: float = 0.7
    seconds: float = 10.0


def parse_rule(value: object) -> StragglerRule | None:
    """``stragglers=``: ``FRACTION/SECONDS`` (``0.7/10``, also ``70%/10s``; ``0.5`` keeps the
    default 10 s), ``on`` (the default rule), ``off`` (None: not watched). A ValueError says
    the spelling."""
    if value is None or value is True or (isinstance(value, str) and value.strip().lower() in _ON):
        return StragglerRule()
    if value is False or str(value).strip().lower() in _OFF:
        return None
    share, sep, window = str(value).strip().lower().partition("/")
    try:
        fraction = float(share[:-1]) / 100 if share.endswith("%") else float(share)
        seconds = float(window.removesuffix("s")) if sep else StragglerRule.seconds
    except ValueError:
        fraction = seconds = -1.0
    if not (0 < fraction < 1 and seconds > 0):
        raise ValueError(
            f"stragglers takes FRACTION/SECONDS, a share of the ranks' median steps/s between 0 and "
            f"1 and a time, e.g. 0.7/10 (or 70%/10s), or off; got {value!r}"
        )
    return StragglerRule(fraction, seconds)
