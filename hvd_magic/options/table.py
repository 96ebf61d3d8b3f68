"""Every option of a run, declared once: its spelling, its help, where it applies and, where it
does not, why (pure).

The ``%%horovod`` parser and its ``%%horovod?`` help, the usage line, the refusals of an option
given where it does not belong (a cell, ``%horovod start``, a live session's cell, the keyword
APIs) and the docs' options page are all made from ``OPTIONS``; a test holds the keyword APIs'
signatures to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hvd_magic.options.parse import OptionError

__all__ = [
    "CELL",
    "ESTIMATORS",
    "OPTIONS",
    "PLACES",
    "RUNNER",
    "SESSION",
    "SESSION_CELL",
    "SESSION_RUN",
    "START",
    "Option",
    "check_given",
    "option",
    "usage",
]

CELL = "%%horovod np=N"  # a cell that is a job of its own
START = "%horovod start"  # a live session's start
SESSION_CELL = "%%horovod on a session"  # a cell on the live session (no np=)
RUNNER = "HorovodRunner"
SESSION = "Session"
SESSION_RUN = "Session.run"
ESTIMATORS = "estimators"  # TorchEstimator / KerasEstimator: under their horovod.spark names
PLACES = (CELL, START, SESSION_CELL, RUNNER, SESSION, SESSION_RUN, ESTIMATORS)

_JOBS = frozenset({CELL, RUNNER})
_SESSION_WIDE = frozenset({CELL, START, RUNNER, SESSION})  # a job's, or a session's for all its cells
_PER_RUN = frozenset({CELL, SESSION_CELL, RUNNER, SESSION_RUN})  # a run's own: a job or one cell

# Why an option is refused where it does not apply ({name}: the option's name).
FIXED_AT_START = "{name}= is set when the session starts (%horovod start ... {name}=...), not per cell"
NO_RESTARTS = (
    "{name}= restarts a run's ranks from its latest checkpoint; a live session's ranks keep state that "
    "a restart would lose. Give {name}= to a job of its own (%%horovod np=N {name}=...), or checkpoint "
    "from the cell with hvd_magic.checkpoint() and resume by hand"
)
SESSION_ONLY = "{name}= is for a live session (%horovod start np=N, then cells without np=)"
PER_CELL = "{name}= is per cell, not for %horovod start"
LOGGED_PER_RUN = (
    "{name}= is for a job of its own or a session's cell (a run of its own each), not for "
    "%horovod start: give it on the %%horovod cells to log"
)
_FIXED = {SESSION_CELL: FIXED_AT_START}
START_ONLY = "{name}= is for %horovod start: it ends the session after that many seconds without a cell"


@dataclass(frozen=True)
class Option:
    """One option: ``name`` as on the magic's line, ``keyword`` as in Python (when it differs)."""

    name: str
    help: str
    where: frozenset[str]
    value: str = "VALUE"  # what the usage line shows after ``name=``
    choices: tuple[str, ...] = ()
    keyword: str = ""
    default: str = ""  # in words, for the docs
    refusals: Mapping[str, str] | None = None  # place -> why not there (a template)

    @property
    def key(self) -> str:
        return self.keyword or self.name

    def refusal(self, place: str) -> str | None:
        """Why this option cannot be given at ``place``, or None where it applies."""
        if place in self.where:
            return None
        template = (self.refusals or {}).get(place, "{name}= does not apply to " + place)
        return template.format(name=self.name)


OPTIONS: tuple[Option, ...] = (
    Option(
        "np",
        "number of ranks: -N runs N ranks on this machine, N on Spark; without it, the cell runs on "
        "the live session (%horovod start np=N)",
        _SESSION_WIDE | {ESTIMATORS},
        value="N",
        default="required (estimators: num_proc)",
    ),
    Option(
        "launcher",
        "mpi (default when mpirun exists) or gloo",
        _SESSION_WIDE | {ESTIMATORS},
        value="mpi|gloo",
        choices=("mpi", "gloo"),
        default="mpi when mpirun exists, else gloo",
        refusals=_FIXED,
    ),
    Option(
        "backend",
        "horovod (default) or torch: torch.distributed ranks",
        _SESSION_WIDE,
        value="horovod|torch",
        choices=("horovod", "torch"),
        default="horovod",
        refusals=_FIXED,
    ),
    Option(
        "env",
        "extra environment for the ranks: KEY=VALUE,KEY2=VALUE2",
        _SESSION_WIDE | {ESTIMATORS},
        value="K=V,...",
        refusals=_FIXED,
    ),
    Option(
        "return",
        "rank 0 variables to copy back: a,b",
        frozenset({CELL, SESSION_CELL}),
        value="a,b",
        keyword="return_names",
        refusals={START: PER_CELL},
    ),
    Option(
        "timeout",
        "end the run when no rank reports anything for this many seconds",
        _SESSION_WIDE | {SESSION_CELL},
        value="SECONDS",
        default="none",
    ),
    Option(
        "timeline",
        "record a Horovod Timeline: on, cycles (mark cycles) or a file path; %horovod start "
        "timeline=yes: the live session's cells may record theirs",
        _SESSION_WIDE | _PER_RUN,
        value="on|cycles|PATH",
        default="off",
    ),
    Option(
        "data",
        "a DataFrame of the notebook: each rank reads its shard with hvd_magic.shard()",
        _SESSION_WIDE | {ESTIMATORS},
        value="DATAFRAME",
        refusals=_FIXED,
    ),
    Option(
        "remainder",
        "rows of data= that do not split evenly: drop (default: equal shards) or keep",
        _SESSION_WIDE,
        value="drop|keep",
        choices=("drop", "keep"),
        default="drop",
        refusals=_FIXED,
    ),
    Option(
        "oversubscribe",
        "np=-N: allow more than 4 local ranks a CPU core (refused otherwise, as a likely typo)",
        _SESSION_WIDE,
        value="yes",
        choices=("yes", "no"),
        default="no",
        refusals=_FIXED,
    ),
    Option(
        "retries",
        "start again, from the last checkpoint, up to N times after a rank is lost outside your code",
        _JOBS | {ESTIMATORS},
        value="N",
        default="0",
        refusals={place: NO_RESTARTS for place in (START, SESSION_CELL, SESSION, SESSION_RUN)},
    ),
    Option(
        "min_np",
        "with retries=: after a loss, go on with at least M ranks (the slots there are) from the last "
        "checkpoint instead of waiting for all np; back to np at a checkpoint once the slots return",
        _JOBS | {ESTIMATORS},
        value="M",
        default="np (never fewer)",
        refusals={place: NO_RESTARTS for place in (START, SESSION_CELL, SESSION, SESSION_RUN)},
    ),
    Option(
        "resize_wait",
        "with min_np=: how long to wait for all np slots after a loss before going on with fewer",
        _JOBS | {ESTIMATORS},
        value="SECONDS",
        default="30",
        refusals={place: NO_RESTARTS for place in (START, SESSION_CELL, SESSION, SESSION_RUN)},
    ),
    Option(
        "checkpoint_dir",
        "where hvd_magic.checkpoint() keeps the checkpoints: a folder of this machine or an fsspec URL",
        _JOBS,
        value="DIR",
        default="a temporary folder",
        refusals={place: NO_RESTARTS for place in (START, SESSION_CELL, SESSION, SESSION_RUN)},
    ),
    Option(
        "logdir",
        "write the reported metrics as TensorBoard event files: a run's folder in DIR",
        _PER_RUN,
        value="DIR",
        refusals={START: LOGGED_PER_RUN, SESSION: LOGGED_PER_RUN},
    ),
    Option(
        "mlflow",
        "log to MLflow: yes starts an MLflow run if none is active; default: log when one is active",
        _PER_RUN,
        value="yes|no",
        choices=("yes", "no"),
        default="log when an MLflow run is active",
        refusals={START: LOGGED_PER_RUN, SESSION: LOGGED_PER_RUN},
    ),
    Option(
        "stragglers",
        "name a rank whose steps/s stays below FRACTION of the median for SECONDS: FRACTION/SECONDS "
        "(default 0.7/10, also 70%/10s), or off",
        _SESSION_WIDE | _PER_RUN,
        value="0.7/10|off",
        default="0.7/10",
    ),
    Option(
        "rank",
        "live session: run the cell on this rank only (it must not call collectives)",
        frozenset({SESSION_CELL}),
        value="R",
        refusals={CELL: SESSION_ONLY, START: PER_CELL},
    ),
    Option(
        "ranks",
        "live session: run the cell on these ranks only: 0,2",
        frozenset({SESSION_CELL, SESSION_RUN}),
        value="0,2",
        refusals={CELL: SESSION_ONLY, START: PER_CELL},
    ),
    Option(
        "idle",
        "%horovod start: end the session after this many seconds without a cell",
        frozenset({START, SESSION}),
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
