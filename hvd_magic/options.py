"""Validates run options given as ``key=value`` (magic line) or keywords (HorovodRunner)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from hvd_magic.data.source import check_source
from hvd_magic.errors import DataError
from hvd_magic.run.stragglers import StragglerRule, parse_rule
from hvd_magic.sinks.extras import mlflow_module, tensorboard_record_writer

__all__ = ["RunOptions", "OptionError", "make_options", "parse_env", "parse_names"]


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
    checkpoint_dir: str | None = None  # where hvd_magic.checkpoint() keeps them; None: a temporary folder
    checkpoint_unit: str = "step"  # what a checkpoint's number counts, in the view (estimators: "epoch")
    logdir: str | None = None  # TensorBoard event files: a folder per run in it
    mlflow: bool | None = None  # log to MLflow: None when a run is active, True starts one, False never
    params: dict[str, Any] = field(default_factory=dict)  # more to log as MLflow params (estimators')
    stragglers: StragglerRule | None = field(default_factory=StragglerRule)  # None: not watched

    @property
    def ranks(self) -> int:
        return abs(self.np)


class OptionError(ValueError):
    """A bad option; the magic turns it into a UsageError, HorovodRunner into a ValueError."""


def parse_np(value: object) -> int:
    try:
        np = int(str(value))
    except ValueError:
        raise OptionError(f"np must be a whole number, got {value!r}") from None
    if np == 0:
        raise OptionError(
            "np must not be 0: use np=-N to run N ranks on this machine, np=N for N ranks on Spark"
        )
    return np


LOCAL_RANKS_PER_CORE = 4  # above this many local ranks a core, np=-N is taken for a typo


def machine_cores() -> int:
    """The CPU cores this process may run on (its affinity: a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_local_ranks(np: int, oversubscribe: bool, cores: int) -> list[str]:
    """Refuse a local np far above the machine's cores (almost always a typo: 1,000 ranks on 2
    cores thrash for minutes before anything useful happens); past the cores, say what it means."""
    ranks = -np
    if np > 0 or ranks <= cores or oversubscribe:
        return []
    if ranks > LOCAL_RANKS_PER_CORE * cores:
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


def parse_retries(value: object) -> int:
    if value is None:
        return 0
    try:
        retries = int(str(value))
    except ValueError:
        raise OptionError(f"retries must be a whole number, got {value!r}") from None
    if retries < 0:
        raise OptionError(f"retries must be 0 or more, got {retries}")
    return retries


def parse_checkpoint_dir(value: str | None) -> str | None:
    if not value or "://" in value:
        return value or None  # a URL is checked when the run opens it (fsspec)
    folder = os.path.abspath(os.path.expanduser(value))
    parent = os.path.dirname(folder)
    if not os.path.isdir(folder) and not os.path.isdir(parent):
        raise OptionError(f"checkpoint_dir={value}: neither it nor its folder {parent} exists; make it first")
    return folder


def parse_logdir(value: str | None) -> str | None:
    """A folder for TensorBoard event files (made if missing); refused without tensorboard."""
    if not value:
        return None
    if "://" in value:
        raise OptionError(f"logdir={value}: give a folder of this machine (or a mount: /dbfs/...), not a URL")
    folder = os.path.abspath(os.path.expanduser(value))
    try:
        tensorboard_record_writer()
        os.makedirs(folder, exist_ok=True)
    except (ImportError, OSError) as err:
        raise OptionError(f"logdir={value}: {err}") from None
    return folder


def parse_yes_no(name: str, value: object) -> bool | None:
    """yes/no (or True/False, 1/0) as a bool; None when not given."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("yes", "true", "1", "no", "false", "0"):
        return text in ("yes", "true", "1")
    raise OptionError(f"{name} must be yes or no, got {value!r}")


def parse_mlflow(value: object) -> bool | None:
    """yes (log, starting an MLflow run if none is active), no (never), or None (when one is)."""
    wanted = parse_yes_no("mlflow", value)
    if not wanted:
        return wanted
    try:
        mlflow_module()
    except ImportError as err:
        raise OptionError(str(err)) from None
    return True


def parse_stragglers(value: object) -> StragglerRule | None:
    try:
        return parse_rule(value)
    except ValueError as err:
        raise OptionError(str(err)) from None


def parse_oversubscribe(value: object) -> bool:
    return bool(parse_yes_no("oversubscribe", value))


def parse_env(text: str | dict[str, str] | None) -> dict[str, str]:
    if not text:
        return {}
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    env = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise OptionError(f"env takes KEY=VALUE pairs separated by commas, got {item!r}")
        env[key.strip()] = value
    return env


def parse_names(text: str | list[str] | None) -> list[str]:
    if not text:
        return []
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise OptionError(f"return takes variable names separated by commas; not names: {bad}")
    return names


def parse_launcher(value: str | None) -> str:
    if value is None:
        return "mpi" if shutil.which("mpirun") else "gloo"
    if value not in ("mpi", "gloo"):
        raise OptionError(f"launcher must be mpi or gloo, got {value!r}")
    return value


def parse_timeout(value: object) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(str(value))
    except ValueError:
        raise OptionError(f"timeout must be a number of seconds, got {value!r}") from None
    if seconds <= 0:
        raise OptionError(f"timeout must be positive, got {value!r}")
    return seconds


def parse_timeline(value: str | None) -> tuple[str | None, bool]:
    """``on`` / ``cycles`` (a new file in the notebook's folder), a path, or off."""
    if value is None or value in ("off", "no", "false", ""):
        return None, False
    if value in ("on", "yes", "true", "cycles"):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return os.path.abspath(f"horovod_timeline-{stamp}.json"), value == "cycles"
    folder = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(folder):
        raise OptionError(f"timeline={value!r}: the folder {folder} does not exist")
    return os.path.abspath(value), False


def parse_remainder(value: str | None) -> bool:
    """``drop`` (the default: equal shards) or ``keep``; True to keep."""
    if value not in (None, "drop", "keep"):
        raise OptionError(f"remainder must be drop or keep, got {value!r}")
    return value == "keep"


def parse_backend(value: str | None, launcher: str | None) -> str | None:
    """``backend=torch`` runs torch.distributed ranks: the launcher becomes ``torch``."""
    if value in (None, "horovod"):
        return launcher
    if value != "torch":
        raise OptionError(f"backend must be horovod or torch, got {value!r}")
    if launcher is not None:
        raise OptionError(
            "launcher= picks Horovod's controller (mpi or gloo); backend=torch starts torch.distributed "
            "ranks, which need neither: drop launcher="
        )
    return "torch"


def make_options(
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
    checkpoint_dir: str | None = None,
    logdir: str | None = None,
    mlflow: object = None,
    stragglers: object = None,
) -> RunOptions:
    np_value = parse_np(np)
    notices = check_local_ranks(np_value, parse_oversubscribe(oversubscribe), machine_cores())
    timeline_path, mark_cycles = parse_timeline(timeline)
    if data is not None:
        try:
            check_source(data, data_name)
        except DataError as err:
            raise OptionError(str(err)) from None
    elif remainder is not None:
        raise OptionError(
            "remainder= says what to do with rows of data= that do not split evenly; give data="
        )
    return RunOptions(
        np=np_value,
        launcher=_launcher_for(backend, launcher),
        env=parse_env(env),
        return_names=parse_names(return_names),
        timeout=parse_timeout(timeout),
        timeline=timeline_path,
        mark_cycles=mark_cycles,
        data=data,
        data_name=data_name,
        keep_remainder=parse_remainder(remainder),
        notices=notices,
        retries=parse_retries(retries),
        checkpoint_dir=parse_checkpoint_dir(checkpoint_dir),
        logdir=parse_logdir(logdir),
        mlflow=parse_mlflow(mlflow),
        stragglers=parse_stragglers(stragglers),
    )


def _launcher_for(backend: str | None, launcher: str | None) -> str:
    chosen = parse_backend(backend, launcher)
    return "torch" if chosen == "torch" else parse_launcher(chosen)
