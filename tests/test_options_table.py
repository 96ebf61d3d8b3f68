"""Each option is declared once, in ``hvd_magic.options.OPTIONS``: the magic's parser, its help,
its usage line, the refusals of an option given where it does not apply, and the keyword APIs'
signatures all agree with the table (a new option or keyword that skips it fails here)."""

from __future__ import annotations

import inspect
import re

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from hvd_magic import HorovodRunner, Session
from hvd_magic.notebook.magics import HorovodMagics, given, normalize_line
from hvd_magic.options import OPTIONS, OptionError, check_given
from hvd_magic.options.table import CELL, PLACES, RUNNER, SESSION, SESSION_CELL, SESSION_RUN, START, usage

MAGIC_PLACES = (CELL, START, SESSION_CELL)


def keywords(function: object, *not_options: str) -> set[str]:
    names = set(inspect.signature(function).parameters)  # type: ignore[arg-type]
    return names - {"self", "kwargs", *not_options}


def table_keys(place: str) -> set[str]:
    return {entry.key for entry in OPTIONS if place in entry.where}


@pytest.mark.parametrize(
    ("api", "place", "not_options"),
    [
        (HorovodRunner.__init__, RUNNER, ("driver_log_verbosity",)),  # sparkdl's, accepted and ignored
        (Session.__init__, SESSION, ()),
        (Session.run, SESSION_RUN, ("main",)),
    ],
)
def test_the_keyword_apis_take_the_tables_options_for_them(api, place, not_options):
    assert keywords(api, *not_options) == table_keys(place)


def test_the_magics_parser_and_help_are_the_table():
    helped = HorovodMagics.horovod.parser.format_help()  # type: ignore[attr-defined]
    assert re.findall(r"^  (--\w+)", helped, re.M) == [f"--{entry.name}" for entry in OPTIONS]
    assert "70%/10s" in helped  # help text is escaped for argparse's % formatting
    for entry in OPTIONS:
        value = entry.choices[-1] if entry.choices else "-3"
        args = parse_argstring(HorovodMagics.horovod, f"--{entry.name}={value}")
        assert given(args)[entry.name] == value
        assert {name for name, v in given(args).items() if v is not None} == {entry.name}
        if entry.choices:
            with pytest.raises(UsageError):
                parse_argstring(HorovodMagics.horovod, f"--{entry.name}=neither")


def test_the_usage_line_shows_every_option_of_a_cell():
    line = usage()
    for entry in OPTIONS:
        assert (f"{entry.name}=" in line) == (CELL in entry.where), entry.name


@pytest.mark.parametrize("place", MAGIC_PLACES)
@pytest.mark.parametrize("entry", OPTIONS, ids=lambda entry: entry.name)
def test_an_option_given_where_it_does_not_apply_is_refused_with_why(entry, place):
    if place in entry.where:
        check_given(place, {entry.name: "1"})  # no refusal
        assert entry.refusal(place) is None
        return
    with pytest.raises(OptionError) as info:
        check_given(place, {entry.name: "1"})
    assert str(info.value).startswith(f"{entry.name}=")
    assert "{" not in str(info.value)  # the template was filled


def test_what_a_session_cell_and_a_start_refuse_say_what_to_do():
    with pytest.raises(OptionError, match=r"env= is set when the session starts \(%horovod start"):
        check_given(SESSION_CELL, {"env": "A=1"})
    with pytest.raises(OptionError, match="retries= restarts a run's ranks from its latest checkpoint"):
        check_given(SESSION_CELL, {"retries": "2"})
    with pytest.raises(OptionError, match="retries= restarts a run's ranks"):
        check_given(START, {"retries": "2"})  # a session's ranks are never restarted
    with pytest.raises(OptionError, match="logdir= is for a job of its own or a session's cell"):
        check_given(START, {"logdir": "logs"})
    with pytest.raises(OptionError, match="idle= is for %horovod start"):
        check_given(SESSION_CELL, {"idle": "5"})


def test_the_line_is_read_by_the_tables_names():
    assert normalize_line("np=-2 return=a,b") == "--np=-2 --return=a,b"
    assert normalize_line("-np 3") == "--np 3"
    with pytest.raises(UsageError, match="the options are: np, launcher, backend"):
        normalize_line("np=2 nproc=2")


def test_every_place_is_named_in_the_table():
    assert set(PLACES) >= {place for entry in OPTIONS for place in entry.where}
