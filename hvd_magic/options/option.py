"""What an entry of the options' table says (``Option``), how a keyword API takes it
(``Keyword``), the places an option may be given and why one is refused at a place (pure).

``table.OPTIONS`` holds the entries; everything an option is (its spelling, its check, what of
``RunOptions`` it sets, its type and default as a keyword, its help) is said in its entry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CELL",
    "ESTIMATORS",
    "FIXED",
    "FIXED_AT_START",
    "JOBS",
    "LOGGED_PER_RUN",
    "NO_RESTARTS",
    "NO_RESTART_HERE",
    "PER_CELL",
    "PER_RUN",
    "PLACES",
    "REQUIRED",
    "RUNNER",
    "SESSION",
    "SESSION_CELL",
    "SESSION_ONLY",
    "SESSION_RUN",
    "SESSION_WIDE",
    "START",
    "START_ONLY",
    "Keyword",
    "Option",
]

CELL = "%%horovod np=N"  # a cell that is a job of its own
START = "%horovod start"  # a live session's start
SESSION_CELL = "%%horovod on a session"  # a cell on the live session (no np=)
RUNNER = "HorovodRunner"
SESSION = "Session"
SESSION_RUN = "Session.run"
ESTIMATORS = "estimators"  # TorchEstimator / KerasEstimator: under their horovod.spark names
PLACES = (CELL, START, SESSION_CELL, RUNNER, SESSION, SESSION_RUN, ESTIMATORS)

JOBS = frozenset({CELL, RUNNER})
SESSION_WIDE = frozenset({CELL, START, RUNNER, SESSION})  # a job's, or a session's for all its cells
PER_RUN = frozenset({CELL, SESSION_CELL, RUNNER, SESSION_RUN})  # a run's own: a job or one cell

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
FIXED = {SESSION_CELL: FIXED_AT_START}
START_ONLY = "{name}= is for %horovod start: it ends the session after that many seconds without a cell"
NO_RESTART_HERE = {place: NO_RESTARTS for place in (START, SESSION_CELL, SESSION, SESSION_RUN)}

REQUIRED: Any = inspect.Parameter.empty  # the default of a keyword that must be given (np)


@dataclass(frozen=True)
class Keyword:
    """An option as a keyword API takes it: the annotation in its signature (a type, as
    ``typing.get_type_hints`` reads it), its default, and its name there when not the option's
    (the estimators' ``num_proc``)."""

    kind: Any
    default: Any = None
    name: str = ""


@dataclass(frozen=True)
class Option:
    """One option: ``name`` as on the magic's line, ``keyword`` as in Python (when it differs).

    ``parse`` turns the value given (the line's text, or a keyword's Python value; None when not
    given) into what the run uses, taking after it the parsed values of the earlier options that
    ``uses`` names; that value sets the ``RunOptions`` fields ``sets`` names (the option's key
    when None; a tuple value sets one field each). An entry without ``parse`` is read by the
    live session itself (``rank=``, ``idle=``).
    """

    name: str
    help: str
    where: frozenset[str]
    python: Keyword  # as HorovodRunner, Session and Session.run take it
    parse: Callable[..., Any] | None = None
    uses: tuple[str, ...] = ()
    sets: tuple[str, ...] | None = None
    value: str = "VALUE"  # what the usage line shows after ``name=``
    choices: tuple[str, ...] = ()
    keyword: str = ""
    default: str = ""  # in words, for the docs
    refusals: Mapping[str, str] | None = None  # place -> why not there (a template)
    python_at: Mapping[str, Keyword] | None = None  # place -> how it is taken there, where not ``python``
    session_holds: bool = False  # not given on a session's cell: the session's value, not the default

    @property
    def key(self) -> str:
        return self.keyword or self.name

    @property
    def fields(self) -> tuple[str, ...]:
        """The ``RunOptions`` fields this option sets."""
        if self.parse is None:
            return ()
        return (self.key,) if self.sets is None else self.sets

    def keyword_at(self, place: str) -> Keyword:
        """How the keyword API at ``place`` takes this option."""
        return (self.python_at or {}).get(place, self.python)

    def refusal(self, place: str) -> str | None:
        """Why this option cannot be given at ``place``, or None where it applies."""
        if place in self.where:
            return None
        template = (self.refusals or {}).get(place, "{name}= does not apply to " + place)
        return template.format(name=self.name)

    def parsed(self, given: object, earlier: Mapping[str, Any]) -> Any:
        """``given`` checked and made into what the run uses (``OptionError`` if it cannot be)."""
        assert self.parse is not None, f"{self.name}= is read by the session, not parsed here"
        return self.parse(given, *(earlier[name] for name in self.uses))

    def set_on(self, fields: dict[str, Any], value: Any) -> None:
        """Put ``value`` (a tuple: one item a field) in ``fields``, under this option's fields."""
        names = self.fields
        if len(names) == 1:
            fields[names[0]] = value
        elif names:
            fields.update(zip(names, value, strict=True))
