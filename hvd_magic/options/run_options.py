"""``RunOptions``, what a run is told, filled from the options' table: a job's (``make_options``)
or a live session's cell, which takes the session's and changes only a cell's own
(``cell_options``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hvd_magic.options.option import SESSION_CELL, Option
from hvd_magic.options.straggler_rule import StragglerRule
from hvd_magic.options.table import OPTIONS

__all__ = ["RunOptions", "cell_options", "keywords", "make_options"]


@dataclass
class RunOptions:
    """What a run is told. A field an option sets is that option's: its entry in ``OPTIONS``
    names it, and its parser makes its value (tests hold the fields' types and defaults to
    them); the others are the run's own."""

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


# The options that fill a run's fields (in the table's order: an option's parser may take the
# values of those before it); a session cell's own among them.
JOB_OPTIONS = tuple(entry for entry in OPTIONS if entry.parse is not None)
CELL_OWN = tuple(entry for entry in JOB_OPTIONS if SESSION_CELL in entry.where)


def keywords(place: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The options the keyword API at ``place`` takes, by keyword, from ``values`` (its
    ``locals()``: tests hold its signature to the table)."""
    return {entry.key: values[entry.key] for entry in OPTIONS if place in entry.where}


def make_options(*, data_name: str = "data", **given: Any) -> RunOptions:
    """A job's options from the values given by keyword (the magic's text or Python's; None: not
    given), each checked by its table entry's parser; else ``OptionError``. ``data_name``: how
    the user named ``data=``, for messages."""
    unknown = sorted(set(given) - {entry.key for entry in JOB_OPTIONS})
    if unknown:
        raise TypeError(f"make_options() got an unexpected keyword argument {unknown[0]!r}")
    return RunOptions(**_fields(JOB_OPTIONS, given, {"data_name": data_name}), data_name=data_name)


def cell_options(base: RunOptions, given: Mapping[str, Any]) -> RunOptions:
    """A live session's cell: the session's options (``base``) with the cell's own, given by
    keyword (others, such as ``ranks``, are not the cell's options' to read)."""
    own = [entry for entry in CELL_OWN if not (entry.session_holds and given.get(entry.key) is None)]
    return dataclasses.replace(base, **_fields(own, given, {}), notices=[])


def _fields(entries: Iterable[Option], given: Mapping[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """The ``RunOptions`` fields ``entries`` set from the values ``given``, in order (``earlier``:
    what their parsers may take besides those of the entries before them)."""
    fields: dict[str, Any] = {}
    for entry in entries:
        earlier[entry.key] = value = entry.parsed(given.get(entry.key), earlier)
        entry.set_on(fields, value)
    return fields
