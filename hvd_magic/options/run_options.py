"""``RunOptions``, what a run is told, made from checked options: a job's (``make_options``) or a
live session's cell, which takes the session's and changes only a cell's own (``cell_options``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from hvd_magic.data.source import check_source
from hvd_magic.errors import DataError
from hvd_magic.options.parse import (
    OptionError,
    parse_backend,
    parse_checkpoint_dir,
    parse_env,
    parse_launcher,
    parse_logdir,
    parse_min_np,
    parse_mlflow,
    parse_names,
    parse_np,
    parse_oversubscribe,
    parse_remainder,
    parse_resize_wait,
    parse_retries,
    parse_stragglers,
    parse_timeline,
    parse_timeout,
)
from hvd_magic.options.straggler_rule import StragglerRule
from hvd_magic.protocol.env import ENV_PREEMPTION, ENV_TIMING_LIMIT, parse_timing_limit, preemption_error

__all__ = [
    "LOCAL_RANKS_PER_CORE",
    "RunOptions",
    "cell_options",
    "check_local_ranks",
    "local_load",
    "machine_cores",
    "make_options",
]


@dataclass
class RunOptions:
    np: int
    launcher: str = "mpi"  # how ranks start: mpi or gloo (Horovod), torch (backend=torch)
    env: dict[str, str] = field(default_factory=dict)
    return_names: list[str] = field(default_factory=list)
    timeout: float | None = None  # seconds without any rank event before the run is ended
    timeline: str | None = None  # where the notebook side writes the Horovod Timeline
    mark_cycles: bool = False
    data: Any = None  # data=: a Spark DataFrame (classic or Connect), pandas DataFrame or Arrow table
    data_name: str = "data"  # how the user named it, for messages
    keep_remainder: bool = False  # remainder=keep: the last total % np rows go to the first ranks
    files_dir: str | None = None  # where files rank 0 sends (send_file) are written; None: refused
    notices: list[str] = field(default_factory=list)  # told in the cell before the run starts
    retries: int = 0  # times a run that lost a rank (not to the user's code) starts again
    min_np: int | None = None  # after a loss, go on with this many ranks or more (None: np only)
    resize_wait: float = 30.0  # ... once all np slots were not back within this many seconds
    checkpoint_dir: str | None = None  # where hvd_magic.checkpoint() keeps them; None: a temporary folder
    checkpoint_unit: str = "step"  # what a checkpoint's number counts, in the view (estimators: "epoch")
    logdir: str | None = None  # TensorBoard event files: a folder per run in it
    mlflow: bool | None = None  # log to MLflow: None when a run is active, True starts one, False never
    params: dict[str, Any] = field(default_factory=dict)  # more to log as MLflow params (estimators')
    stragglers: StragglerRule | None = field(default_factory=StragglerRule)  # None: not watched

    @property
    def ranks(self) -> int:
        return abs(self.np)


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


def make_options(
    *,
    np: object,
    launcher: str | None = None,
    env: str | dict[str, str] | None = None,
    return_names: str | list[str] | None = None,
    timeout: object = None,
    timeline: str | None = None,
    data: Any = None,
    data_name: str = "data",
    remainder: str | None = None,
    backend: str | None = None,
    oversubscribe: object = None,
    retries: object = None,
    min_np: object = None,
    resize_wait: object = None,
    checkpoint_dir: str | None = None,
    logdir: str | None = None,
    mlflow: object = None,
    stragglers: object = None,
) -> RunOptions:
    """A job's options from the values given (the magic's text or Python's); else ``OptionError``."""
    np_value = parse_np(np)
    notices = check_local_ranks(np_value, parse_oversubscribe(oversubscribe), machine_cores())
    if data is not None:
        try:
            check_source(data, data_name)
        except DataError as err:
            raise OptionError(str(err)) from None
    elif remainder is not None:
        raise OptionError(
            "remainder= says what to do with rows of data= that do not split evenly; give data="
        )
    env_value = _checked_env(env)
    retries_value = parse_retries(retries)
    min_np_value = parse_min_np(min_np, abs(np_value), retries_value)
    job = RunOptions(
        np=np_value,
        launcher=_launcher_for(backend, launcher),
        env=env_value,
        data=data,
        data_name=data_name,
        keep_remainder=parse_remainder(remainder),
        notices=notices,
        retries=retries_value,
        min_np=min_np_value,
        resize_wait=parse_resize_wait(resize_wait, min_np_value),
        checkpoint_dir=parse_checkpoint_dir(checkpoint_dir),
    )
    return _with_run_own(job, return_names, timeout, timeline, logdir, mlflow, stragglers)


def _checked_env(env: str | dict[str, str] | None) -> dict[str, str]:
    """``env=``, with the preemption notice's source and the wait timing's limit checked (the
    notebook's own variables too)."""
    values = parse_env(env)
    preemption = values.get(ENV_PREEMPTION, os.environ.get(ENV_PREEMPTION, ""))
    if preemption and (problem := preemption_error(preemption)):
        raise OptionError(problem)
    try:
        parse_timing_limit(values.get(ENV_TIMING_LIMIT, os.environ.get(ENV_TIMING_LIMIT)))
    except ValueError as err:
        raise OptionError(str(err)) from None
    return values


def _launcher_for(backend: str | None, launcher: str | None) -> str:
    chosen = parse_backend(backend, launcher)
    return "torch" if chosen == "torch" else parse_launcher(chosen)


def cell_options(
    base: RunOptions,
    *,
    return_names: str | list[str] | None = None,
    timeout: object = None,
    timeline: str | None = None,
    logdir: str | None = None,
    mlflow: object = None,
    stragglers: object = None,
) -> RunOptions:
    """A live session's cell: the session's options (``base``) with the cell's own."""
    cell = _with_run_own(base, return_names, timeout, timeline, logdir, mlflow, stragglers)
    return dataclasses.replace(cell, notices=[])


def _with_run_own(
    base: RunOptions,
    return_names: str | list[str] | None,
    timeout: object,
    timeline: str | None,
    logdir: str | None,
    mlflow: object,
    stragglers: object,
) -> RunOptions:
    """``base`` with a run's own options (a job's, or a session cell's): stragglers= keeps the
    base's rule when not given."""
    timeline_path, mark_cycles = parse_timeline(timeline)
    return dataclasses.replace(
        base,
        return_names=parse_names(return_names),
        timeout=parse_timeout(timeout),
        timeline=timeline_path,
        mark_cycles=mark_cycles,
        logdir=parse_logdir(logdir),
        mlflow=parse_mlflow(mlflow),
        stragglers=base.stragglers if stragglers is None else parse_stragglers(stragglers),
    )
