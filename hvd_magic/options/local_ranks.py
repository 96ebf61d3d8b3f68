"""``np=-N`` against this machine's cores: refused far above them (a likely typo) unless
``oversubscribe=yes``, said once above one rank a core."""

from __future__ import annotations

import os

from hvd_magic.options.parse import OptionError, parse_yes_no

__all__ = ["LOCAL_RANKS_PER_CORE", "check_local_ranks", "local_load", "local_notices", "machine_cores"]

LOCAL_RANKS_PER_CORE = 4  # above this many local ranks a core, np=-N is taken for a typo


def machine_cores() -> int:
    """The CPU cores this process may run on (its affinity: a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_load(ranks: int, cores: int) -> str:
    """How ``ranks`` processes on this machine's ``cores`` go: "fits" (a core or more each),
    "shares" (they take turns) or "thrashes" (over ``LOCAL_RANKS_PER_CORE`` a core: a typo)."""
    if ranks <= cores:
        return "fits"
    return "thrashes" if ranks > LOCAL_RANKS_PER_CORE * cores else "shares"


def check_local_ranks(np: int, oversubscribe: bool, cores: int) -> list[str]:
    """Refuse a local np far above the machine's cores (almost always a typo: 1,000 ranks on 2
    cores thrash for minutes before anything useful happens); past the cores, say what it means."""
    ranks = -np
    load = local_load(ranks, cores) if np < 0 and not oversubscribe else "fits"
    if load == "fits":
        return []
    if load == "thrashes":
        raise OptionError(
            f"np={np} would start {ranks:,} ranks on this machine, which has {cores} CPU "
            f"core{'s' if cores > 1 else ''}: each rank is a process with its own framework, and that many "
            f"would thrash it. Use at most np=-{LOCAL_RANKS_PER_CORE * cores} here "
            f"({LOCAL_RANKS_PER_CORE} a core), np={ranks} to run on the Spark cluster, or add "
            "oversubscribe=yes (HorovodRunner: oversubscribe=True) if you mean it."
        )
    return [
        f"np={np} runs {ranks} ranks on this machine's {cores} CPU core{'s' if cores > 1 else ''}: they take "
        "turns on the cores (one thread each), fine for trying code, slower for training."
    ]


def local_notices(oversubscribe: object, np: int) -> list[str]:
    """``oversubscribe=``: what ``np`` ranks on this machine's cores are told (or refused)."""
    return check_local_ranks(np, bool(parse_yes_no("oversubscribe", oversubscribe)), machine_cores())
