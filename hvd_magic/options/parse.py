"""Each option's value checked and turned into what a run uses, from the magic line's text or a
keyword's value alike (pure but for the checks that look at this machine: folders, mpirun, packages)."""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hvd_magic.data.source import check_source
from hvd_magic.errors import DataError
from hvd_magic.options.extras import mlflow_module
from hvd_magic.options.straggler_rule import StragglerRule, parse_rule
from hvd_magic.protocol.env import ENV_PREEMPTION, ENV_TIMING_LIMIT, parse_timing_limit, preemption_error

__all__ = [
    "OptionError",
    "parse_backend",
    "parse_data",
    "parse_env",
    "parse_launcher",
    "parse_launcher_given",
    "parse_min_np",
    "parse_mlflow",
    "parse_names",
    "parse_np",
    "parse_remainder",
    "parse_resize_wait",
    "parse_retries",
    "parse_stragglers",
    "parse_timeline",
    "parse_timeout",
    "parse_yes_no",
]

Number = TypeVar("Number", int, float)
RESIZE_WAIT_SECONDS = 30.0  # after a loss, for all np slots, before going on with min_np=


class OptionError(ValueError):
    """A bad option; the magic turns it into a UsageError, the keyword APIs into a ValueError."""


def _as(convert: Callable[[str], Number], value: object, said: str) -> Number:
    """``value`` converted, or an ``OptionError`` that says what it must be and what it was."""
    try:
        number = convert(str(value))
    except ValueError:
        raise OptionError(f"{said}, got {value!r}") from None
    if not math.isfinite(number):  # nan would compare false with every bound and never end
        raise OptionError(f"{said}, got {value!r}")
    return number


def parse_np(value: object) -> int:
    np = _as(int, value, "np must be a whole number")
    if np == 0:
        raise OptionError(
            "np must not be 0: use np=-N to run N ranks on this machine, np=N for N ranks on Spark"
        )
    return np


def parse_retries(value: object) -> int:
    if value is None:
        return 0
    retries = _as(int, value, "retries must be a whole number")
    if retries < 0:
        raise OptionError(f"retries must be 0 or more, got {retries}")
    return retries


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


def parse_env(text: str | dict[str, str] | None) -> dict[str, str]:
    """``env=``: KEY=VALUE pairs (or a dict), with the preemption notice's source and the wait
    timing's limit checked (the notebook's own variables too)."""
    env = _pairs(text)
    preemption = env.get(ENV_PREEMPTION, os.environ.get(ENV_PREEMPTION, ""))
    if preemption and (problem := preemption_error(preemption)):
        raise OptionError(problem)
    try:
        parse_timing_limit(env.get(ENV_TIMING_LIMIT, os.environ.get(ENV_TIMING_LIMIT)))
    except ValueError as err:
        raise OptionError(str(err)) from None
    return env


def _pairs(text: str | dict[str, str] | None) -> dict[str, str]:
    if not text:
        return {}
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    env: dict[str, str] = {}
    key = ""
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if sep and name.strip().isidentifier():
            key = name.strip()
            env[key] = value
        elif key and not sep and item:  # CUDA_VISIBLE_DEVICES=0,1: a comma within the value
            env[key] += "," + item
        else:
            raise OptionError(
                f"env takes KEY=VALUE pairs separated by commas (a value may hold commas: "
                f"env=CUDA_VISIBLE_DEVICES=0,1,A=2), got {item!r}"
            )
    return env


def parse_data(value: Any, data_name: str) -> Any:
    """``data=``: a DataFrame the ranks can read their shards of (``data_name``: as the user named it)."""
    if value is not None:
        try:
            check_source(value, data_name)
        except DataError as err:
            raise OptionError(str(err)) from None
    return value


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


def parse_launcher_given(value: str | None) -> str | None:
    """``launcher=`` as given (None: chosen with ``backend=``, by ``parse_backend``)."""
    return None if value is None else parse_launcher(value)


def parse_timeout(value: object) -> float | None:
    if value is None:
        return None
    seconds = _as(float, value, "timeout must be a number of seconds")
    if seconds <= 0:
        raise OptionError(f"timeout must be positive, got {value!r}")
    return seconds


def parse_timeline(value: str | bool | None) -> tuple[str | None, bool]:
    """``on`` / ``cycles`` (a new file in the notebook's folder), a path, or off (any case;
    True and False too)."""
    word = str(value).lower()
    if value is None or value is False or word in ("off", "no", "false", ""):
        return None, False
    if value is True or word in ("on", "yes", "true", "cycles"):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return os.path.abspath(f"horovod_timeline-{stamp}.json"), word == "cycles"
    value = str(value)
    folder = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(folder):
        raise OptionError(f"timeline={value!r}: the folder {folder} does not exist")
    return os.path.abspath(value), False


def parse_remainder(value: str | None, data: object) -> bool:
    """``drop`` (the default: equal shards) or ``keep``, of ``data``'s rows; True to keep."""
    if value is not None and data is None:
        raise OptionError(
            "remainder= says what to do with rows of data= that do not split evenly; give data="
        )
    if value not in (None, "drop", "keep"):
        raise OptionError(f"remainder must be drop or keep, got {value!r}")
    return value == "keep"


def parse_backend(value: str | None, launcher: str | None) -> str:
    """The launcher a run uses: ``torch`` for ``backend=torch`` (torch.distributed ranks), else
    ``launcher=``'s (``launcher``: as given) or the default one."""
    if value in (None, "horovod"):
        return parse_launcher(launcher)
    if value != "torch":
        raise OptionError(f"backend must be horovod or torch, got {value!r}")
    if launcher is not None:
        raise OptionError(
            "launcher= picks Horovod's controller (mpi or gloo); backend=torch starts torch.distributed "
            "ranks, which need neither: drop launcher="
        )
    return "torch"


def parse_min_np(value: object, np: int, retries: int) -> int | None:
    """``min_np=M``: 1 <= M <= np's ranks, and only with retries (a resize is a restart)."""
    if value is None:
        return None
    ranks = abs(np)
    min_np = _as(int, value, "min_np must be a whole number of ranks")
    if not 1 <= min_np <= ranks:
        raise OptionError(
            f"min_np={min_np} must be between 1 and np ({ranks}): the fewest ranks to go on with"
        )
    if retries < 1:
        raise OptionError(
            f"min_np={min_np} goes on with fewer ranks when a run starts again after a loss: give "
            f"retries= too (e.g. retries=3 min_np={min_np})"
        )
    return min_np


def parse_resize_wait(value: object, min_np: int | None) -> float:
    if value is None:
        return RESIZE_WAIT_SECONDS
    if min_np is None:
        raise OptionError(
            "resize_wait= is how long to wait for all np slots before going on with min_np=; give min_np="
        )
    seconds = _as(float, value, "resize_wait must be a number of seconds")
    if seconds < 0:
        raise OptionError(f"resize_wait must be 0 or more seconds, got {value!r}")
    return seconds
