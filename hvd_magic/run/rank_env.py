"""What every rank finds in its environment, besides what its launcher sets: the user's
``env=``, the hub's address and key, and what Horovod and TensorFlow need for the run's options."""

from __future__ import annotations

import os
import tempfile
import uuid

from hvd_magic.hub import Hub
from hvd_magic.options import RunOptions
from hvd_magic.protocol.env import (
    ENV_BREAKPOINT_RANKS,
    ENV_HUB,
    ENV_KEEP_CHECKPOINTS,
    ENV_PREEMPTION,
    ENV_TIME_WAITS,
    ENV_TIMING_LIMIT,
    ENV_TOKEN,
    ENV_TRAINERS,
    TF_LEVEL_VARIABLE,
)

__all__ = ["STALL_VARIABLE", "rank_env", "stall_seconds"]

STALL_CHECK_SECONDS = 15
STALL_VARIABLE = "HOROVOD_STALL_CHECK_TIME_SECONDS"  # also how long torch ranks wait before a stall


def rank_env(options: RunOptions, hub: Hub) -> dict[str, str]:
    """What every rank gets in its environment: the user's, the hub's address and keys, and
    what Horovod needs for the options (timeline, tf-keras)."""
    env = dict(options.env)
    defaults = {
        "TF_USE_LEGACY_KERAS": "1",  # Horovod's Keras binding needs tf-keras on TensorFlow >= 2.16
        STALL_VARIABLE: str(STALL_CHECK_SECONDS),  # Horovod's 60 s is long to stare at
        TF_LEVEL_VARIABLE: "1",  # TF's C++ INFO lines: in a notebook they reach the terminal, not the cell
    }
    env |= {name: value for name, value in defaults.items() if name not in env and name not in os.environ}
    # the notebook's, to executors too
    for name in (ENV_BREAKPOINT_RANKS, ENV_PREEMPTION, ENV_TIMING_LIMIT, ENV_TRAINERS):
        if name in os.environ and name not in env:
            env[name] = os.environ[name]
    if options.timeline:
        # Written on rank 0's host (maybe an executor), streamed back by the worker at the end.
        env["HOROVOD_TIMELINE"] = os.path.join(
            tempfile.gettempdir(), f"hvd_magic-timeline-{uuid.uuid4().hex}.json"
        )
        if options.mark_cycles:
            env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    if options.retries or options.checkpoint_dir:  # a trainer's own checkpoints go to the run too
        env[ENV_KEEP_CHECKPOINTS] = "1"
    if options.stragglers is None:  # nothing judges the waits: nothing is added to the ranks' steps
        env[ENV_TIME_WAITS] = "0"
    return env | {ENV_HUB: hub.address, ENV_TOKEN: hub.keys.client_token()}


def stall_seconds(options: RunOptions) -> float:
    """How long ranks wait for others before it is a stall (Horovod's variable, for both backends)."""
    value = options.env.get(STALL_VARIABLE) or os.environ.get(STALL_VARIABLE) or STALL_CHECK_SECONDS
    try:
        return max(1.0, float(value))
    except ValueError:
        return float(STALL_CHECK_SECONDS)
