"""Every option of a run, declared once: its spelling, check, type and default as a keyword, the
fields of a run it sets, its help, where it applies and, where it does not, why.

The magic's parser, ``%%horovod?``, the usage line, ``make_options``/``cell_options``, the
refusals and the docs' options page are made from ``OPTIONS``; tests hold ``RunOptions``' fields,
the keyword APIs' signatures and the estimators' Params to it, with their types and defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hvd_magic.options.local_ranks import local_notices
from hvd_magic.options.option import (
    CELL,
    ESTIMATORS,
    FIXED,
    JOBS,
    LOGGED_PER_RUN,
    NO_RESTART_HERE,
    PER_CELL,
    PER_RUN,
    REQUIRED,
    SESSION,
    SESSION_CELL,
    SESSION_ONLY,
    SESSION_RUN,
    SESSION_WIDE,
    START,
    START_ONLY,
    Keyword,
    Option,
)
from hvd_magic.options.parse import (
    OptionError,
    parse_backend,
    parse_checkpoint_dir,
    parse_data,
    parse_env,
    parse_launcher_given,
    parse_logdir,
    parse_min_np,
    parse_mlflow,
    parse_names,
    parse_np,
    parse_remainder,
    parse_resize_wait,
    parse_retries,
    parse_stragglers,
    parse_timeline,
    parse_timeout,
)

__all__ = ["ESTIMATOR_RETRIES", "OPTIONS", "check_given", "option", "usage"]

ESTIMATOR_RETRIES = 2  # a fit outlives two lost ranks or executors (rank 0 checkpoints every epoch)


OPTIONS: tuple[Option, ...] = (
    Option(
        "np",
        "number of ranks: -N runs N ranks on this machine, N on Spark; without it, the cell runs on "
        "the live session (%horovod start np=N)",
        SESSION_WIDE | {ESTIMATORS},
        Keyword(int, REQUIRED),
        parse_np,
        value="N",
        default="required (estimators: num_proc)",
        python_at={ESTIMATORS: Keyword(int, REQUIRED, name="num_proc")},
    ),
    Option(
        "launcher",
        "mpi (default when mpirun exists) or gloo",
        SESSION_WIDE | {ESTIMATORS},
        Keyword(str | None),
        parse_launcher_given,
        sets=(),  # backend= decides the launcher, with this one
        value="mpi|gloo",
        choices=("mpi", "gloo"),
        default="mpi when mpirun exists, else gloo",
        refusals=FIXED,
    ),
    Option(
        "backend",
        "horovod (default) or torch: torch.distributed ranks",
        SESSION_WIDE,
        Keyword(str | None),
        parse_backend,
        uses=("launcher",),
        sets=("launcher",),  # torch, or launcher='s (or the default one)
        value="horovod|torch",
        choices=("horovod", "torch"),
        default="horovod",
        refusals=FIXED,
    ),
    Option(
        "env",
        "extra environment for the ranks: KEY=VALUE,KEY2=VALUE2",
        SESSION_WIDE | {ESTIMATORS},
        Keyword(dict[str, str] | None),
        parse_env,
        value="K=V,...",
        refusals=FIXED,
    ),
    Option(
        "return",
        "rank 0 variables to copy back: a,b",
        frozenset({CELL, SESSION_CELL}),
        Keyword(list[str] | None),
        parse_names,
        value="a,b",
        keyword="return_names",
        refusals={START: PER_CELL},
    ),
    Option(
        "timeout",
        "end the run when no rank reports anything for this many seconds",
        SESSION_WIDE | {SESSION_CELL},
        Keyword(float | None),
        parse_timeout,
        value="SECONDS",
        default="none",
    ),
    Option(
        "timeline",
        "record a Horovod Timeline: on, cycles (mark cycles) or a file path; %horovod start "
        "timeline=yes: the live session's cells may record theirs",
        SESSION_WIDE | PER_RUN,
        Keyword(str | None),
        parse_timeline,
        sets=("timeline", "mark_cycles"),
        value="on|cycles|PATH",
        default="off",
        python_at={SESSION: Keyword(bool, False)},  # whether its calls may record one
    ),
    Option(
        "data",
        "a DataFrame of the notebook: each rank reads its shard with hvd_magic.shard()",
        SESSION_WIDE | {ESTIMATORS},
        Keyword(Any),
        parse_data,
        uses=("data_name",),
        value="DATAFRAME",
        refusals=FIXED,
    ),
    Option(
        "remainder",
        "rows of data= that do not split evenly: drop (default: equal shards) or keep",
        SESSION_WIDE,
        Keyword(str | None),
        parse_remainder,
        uses=("data",),
        sets=("keep_remainder",),
        value="drop|keep",
        choices=("drop", "keep"),
        default="drop",
        refusals=FIXED,
    ),
    Option(
        "oversubscribe",
        "np=-N: allow more than 4 local ranks a CPU core (refused otherwise, as a likely typo)",
        SESSION_WIDE,
        Keyword(bool, False),
        local_notices,
        uses=("np",),
        sets=("notices",),
        value="yes",
        choices=("yes", "no"),
        default="no",
        refusals=FIXED,
    ),
    Option(
        "retries",
        "start again, from the last checkpoint, up to N times after a rank is lost outside your code",
        JOBS | {ESTIMATORS},
        Keyword(int, 0),
        parse_retries,
        value="N",
        default="0",
        refusals=NO_RESTART_HERE,
        python_at={ESTIMATORS: Keyword(int, ESTIMATOR_RETRIES)},
    ),
    Option(
        "min_np",
        "with retries=: after a loss, go on with at least M ranks (the slots there are) from the last "
        "checkpoint instead of waiting for all np; back to np at a checkpoint once the slots return",
        JOBS | {ESTIMATORS},
        Keyword(int | None),
        parse_min_np,
        uses=("np", "retries"),
        value="M",
        default="np (never fewer)",
        refusals=NO_RESTART_HERE,
    ),
    Option(
        "resize_wait",
        "with min_np=: how long to wait for all np slots after a loss before going on with fewer",
        JOBS | {ESTIMATORS},
        Keyword(float | None),
        parse_resize_wait,
        uses=("min_np",),
        value="SECONDS",
        default="30",
        refusals=NO_RESTART_HERE,
    ),
    Option(
        "checkpoint_dir",
        "where hvd_magic.checkpoint() keeps the checkpoints: a folder of this machine or an fsspec URL",
        JOBS,
        Keyword(str | None),
        parse_checkpoint_dir,
        value="DIR",
        default="a temporary folder",
        refusals=NO_RESTART_HERE,
    ),
    Option(
        "logdir",
        "write the reported metrics as TensorBoard event files: a run's folder in DIR",
        PER_RUN,
        Keyword(str | None),
        parse_logdir,
        value="DIR",
        refusals={START: LOGGED_PER_RUN, SESSION: LOGGED_PER_RUN},
    ),
    Option(
        "mlflow",
        "log to MLflow: yes starts an MLflow run if none is active; default: log when one is active",
        PER_RUN,
        Keyword(bool | None),
        parse_mlflow,
        value="yes|no",
        choices=("yes", "no"),
        default="log when an MLflow run is active",
        refusals={START: LOGGED_PER_RUN, SESSION: LOGGED_PER_RUN},
    ),
    Option(
        "stragglers",
        "name a rank whose steps/s stays below FRACTION of the median for SECONDS: FRACTION/SECONDS "
        "(default 0.7/10, also 70%/10s), or off",
        SESSION_WIDE | PER_RUN,
        Keyword(str | None),
        parse_stragglers,
        value="0.7/10|off",
        default="0.7/10",
        session_holds=True,
    ),
    Option(
        "rank",
        "live session: run the cell on this rank only (it must not call collectives)",
        frozenset({SESSION_CELL}),
        Keyword(int | None),
        value="R",
        refusals={CELL: SESSION_ONLY, START: PER_CELL},
    ),
    Option(
        "ranks",
        "live session: run the cell on these ranks only: 0,2",
        frozenset({SESSION_CELL, SESSION_RUN}),
        Keyword(list[int] | None),
        value="0,2",
        refusals={CELL: SESSION_ONLY, START: PER_CELL},
    ),
    Option(
        "idle",
        "%horovod start: end the session after this many seconds without a cell",
        frozenset({START, SESSION}),
        Keyword(float | None),
        value="SECONDS",
        default="never",
        refusals={CELL: SESSION_ONLY, SESSION_CELL: START_ONLY},
    ),
)

_BY_NAME = {entry.name: entry for entry in OPTIONS}


def option(name: str) -> Option:
    return _BY_NAME[name]


def check_given(place: str, given: Mapping[str, object]) -> None:
    """Refuse (``OptionError``, saying why) the first option in ``given`` (by name, None for
    not given) that does not apply at ``place``."""
    for entry in OPTIONS:
        if given.get(entry.name) is not None and (why := entry.refusal(place)):
            raise OptionError(why)


def usage() -> str:
    """The magic's one-line usage, from the table (a cell's options; the rest in ``%%horovod?``)."""
    shown = " ".join(
        f"[{entry.name}={entry.value}]" for entry in OPTIONS if CELL in entry.where and entry.name != "np"
    )
    return (
        f"usage: %%horovod np=N {shown}\n"
        "np=-N runs N ranks on this machine, np=N on Spark; %%horovod? shows the full help."
    )
