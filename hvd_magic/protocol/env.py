"""Environment variables of the processes a run starts. Secrets travel here, never on argv."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = [
    "ENV_AGENTS",
    "ENV_ATTEMPT",
    "ENV_AGENT_TOKEN",
    "ENV_BREAKPOINT_RANKS",
    "ENV_FORK_SERVER",
    "ENV_HUB",
    "ENV_KEEP_CHECKPOINTS",
    "ENV_PREEMPTION",
    "ENV_RESIZED",
    "ENV_RUN",
    "ENV_SHARD",
    "ENV_SHARDS",
    "ENV_SLOT_GPUS",
    "ENV_TIME_WAITS",
    "ENV_TIMING_LIMIT",
    "ENV_TOKEN",
    "ENV_TRAINERS",
    "ENV_VIA_AGENT",
    "RANK_VARIABLES",
    "TF_LEVEL_VARIABLE",
    "THREAD_VARS",
    "TIMELINE_DYNAMIC",
    "TIMING_LIMIT",
    "WORKER",
    "parse_timing_limit",
    "preemption_error",
    "rank_from_env",
    "worker_command",
]

ENV_HUB = "HVD_MAGIC_HUB"  # the hub's address, for the worker
ENV_TOKEN = "HVD_MAGIC_TOKEN"  # the run's client keys (RunKeys.client_token), for the worker
ENV_SLOT_GPUS = "HVD_MAGIC_SLOT_GPUS"  # JSON list: local rank -> GPU addresses of its Spark slot
ENV_AGENTS = "HVD_MAGIC_AGENTS"  # JSON: host token -> exec agent address, for the rsh client
ENV_AGENT_TOKEN = "HVD_MAGIC_AGENT_TOKEN"  # the agents' client keys, for the rsh client
ENV_VIA_AGENT = "HVD_MAGIC_VIA_AGENT"  # set on what an agent starts: its host token
ENV_SHARDS = "HVD_MAGIC_SHARDS"  # JSON list: local rank -> its data shard file (data=)
ENV_SHARD = "HVD_MAGIC_SHARD"  # this rank's data shard file, read by hvd_magic.shard()
ENV_BREAKPOINT_RANKS = "HVD_MAGIC_BREAKPOINT_RANKS"  # "1", "0,2": whose breakpoints stop (all: unset)
ENV_PREEMPTION = "HVD_MAGIC_PREEMPTION"  # aws, gcp, azure or file:PATH: a notice each rank looks for
ENV_RESIZED = "HVD_MAGIC_RESIZED"  # "4,3": this attempt's ranks, resized from 4 to 3 (min_np=)
ENV_ATTEMPT = "HVD_MAGIC_ATTEMPT"  # "2", "3": a run started again (retries=, min_np=); unset in the first
ENV_RUN = "HVD_MAGIC_RUN"  # the run's id, the same in each of its attempts (what its trainers kept is marked)
ENV_FORK_SERVER = "HVD_MAGIC_FORK_SERVER"  # a warm rank's stand-in: its fork server's socket (mpi on Spark)
ENV_TIME_WAITS = "HVD_MAGIC_TIME_WAITS"  # "0": the rank times no waits in collectives (stragglers=off)
ENV_KEEP_CHECKPOINTS = "HVD_MAGIC_KEEP_CHECKPOINTS"  # "1": retries= or checkpoint_dir= (trainers.resuming)
ENV_TRAINERS = "HVD_MAGIC_TRAINERS"  # "0": no callback added to HF, Lightning or Accelerate (rank.trainers)
ENV_TIMING_LIMIT = "HVD_MAGIC_TIMING_LIMIT"  # "2%", "0.02" or "off": what that timing may cost a step
TIMING_LIMIT = 0.01  # its default: 1 % of the rank's step
TF_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"  # TensorFlow C++ log level: set by the notebook
# a rank's thread budget (launch.processes sets them; a warm rank reads them after its fork)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")
WORKER = "hvd_magic.rank.worker"  # the module every rank runs (python -m, or a warm rank forked)
# HOROVOD_TIMELINE's value for a timeline started and stopped by hvd.start_timeline/stop_timeline
# (a live session's cells): no file of its own until then.
TIMELINE_DYNAMIC = "DYNAMIC"


def preemption_error(value: str) -> str | None:
    """What is wrong with an ``HVD_MAGIC_PREEMPTION`` value, or None."""
    if value.startswith("file:") and len(value) > len("file:") or value.lower() in ("aws", "gcp", "azure"):
        return None
    return (
        f"{ENV_PREEMPTION}={value}: say where each rank looks for a preemption notice: aws, gcp, azure "
        "(the cloud's metadata service) or file:PATH (a file a node agent writes)"
    )


def parse_timing_limit(value: str | None) -> float | None:
    """``HVD_MAGIC_TIMING_LIMIT``: the share of a rank's step its wait timing may cost (``2%``,
    ``0.02``; unset: 1 %), or None for no limit (``off``). A ValueError says the spelling."""
    spelled = (value or "").strip().lower()
    if not spelled:
        return TIMING_LIMIT
    if spelled in ("off", "none", "no", "0"):
        return None
    try:
        limit = float(spelled[:-1]) / 100 if spelled.endswith("%") else float(spelled)
    except ValueError:
        limit = -1.0
    if not 0 < limit < 1:
        raise ValueError(
            f"{ENV_TIMING_LIMIT}={value}: say what share of a rank's step the timing of its waits may "
            "cost before it stops, e.g. 1% or 0.01, or off for no limit"
        )
    return limit


# A rank's (rank, local rank, size) as each launcher sets them, in the order they are looked for
RANK_VARIABLES = (
    ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE"),  # Horovod's Gloo launcher
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),  # other MPIs (PMI)
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),  # torch.distributed's env:// (backend=torch)
)


def rank_from_env(env: Mapping[str, str] = os.environ) -> tuple[int, int, int]:
    """(rank, local rank, size) from the first launcher's variables found in ``env``; (0, 0, 1),
    a run of one, where there are none."""
    for rank, local_rank, size in RANK_VARIABLES:
        if rank in env:
            return int(env[rank]), int(env.get(local_rank, 0)), int(env.get(size, 1))
    return 0, 0, 1


def worker_command() -> list[str]:
    """The command line of every rank started the usual way, whichever launcher starts it."""
    return [sys.executable, "-m", WORKER]
