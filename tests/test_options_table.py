"""Each option is declared once, in ``hvd_magic.options.OPTIONS``: the magic's parser, its help,
its usage line, the refusals of an option given where it does not apply, ``RunOptions``' fields,
the keyword APIs' signatures and the estimators' Params all agree with the table, name by name,
with their types and defaults (a new option, field or keyword that skips it fails here)."""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
from typing import Any, get_args, get_type_hints

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from hvd_magic import HorovodRunner, Session
from hvd_magic.notebook.magics import HorovodMagics, check_given, given, normalize_line, usage
from hvd_magic.options import OPTIONS, OptionError, RunOptions, make_options
from hvd_magic.options.option import (
    CELL,
    ESTIMATORS,
    PLACES,
    REQUIRED,
    RUNNER,
    SESSION,
    SESSION_CELL,
    SESSION_RUN,
    START,
)

MAGIC_PLACES = (CELL, START, SESSION_CELL)
# RunOptions' fields that no option sets: what the run's own code fills in.
RUNS_OWN = {"data_name", "files_dir", "checkpoint_unit", "params"}
# The estimators' options that are not Params of theirs, and how they are given instead.
NOT_PARAMS = {"env": "a SparkBackend's env, KerasEstimator's backend_env", "data": "fit's DataFrame"}


@pytest.mark.parametrize(
    ("api", "place", "not_options"),
    [
        (HorovodRunner.__init__, RUNNER, ("driver_log_verbosity",)),  # sparkdl's, accepted and ignored
        (Session.__init__, SESSION, ()),
        (Session.run, SESSION_RUN, ("main",)),
    ],
)
def test_the_keyword_apis_take_the_tables_options_with_its_types_and_defaults(api, place, not_options):
    parameters = inspect.signature(api).parameters
    taken = set(parameters) - {"self", "kwargs", *not_options}
    assert taken == {entry.key for entry in OPTIONS if place in entry.where}
    hints = get_type_hints(api)
    for entry in OPTIONS:
        if place in entry.where:
            keyword = entry.keyword_at(place)
            assert (hints[entry.key], parameters[entry.key].default) == (keyword.kind, keyword.default), (
                entry.key
            )


def test_run_options_fields_are_the_tables_with_its_parsers_types_and_defaults(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/mpirun")  # launcher's default: mpi
    hints = get_type_hints(RunOptions)
    set_by = {name: entry for entry in OPTIONS for name in entry.fields}
    assert set(hints) == set(set_by) | RUNS_OWN and not set(set_by) & RUNS_OWN
    not_given, default = make_options(np=4), RunOptions(np=4)
    for name, entry in set_by.items():
        made = get_type_hints(entry.parse)["return"]
        kinds = get_args(made) if len(entry.fields) > 1 else (made,)
        assert hints[name] == kinds[entry.fields.index(name)], name
        assert getattr(default, name) == getattr(not_given, name), name  # the default is "not given"
    assert [f.name for f in dataclasses.fields(RunOptions) if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING] == ["np"]  # fmt: skip


def test_a_parser_takes_the_values_of_options_before_it():
    earlier = {"data_name"}  # make_options' own keyword
    for entry in OPTIONS:
        assert set(entry.uses) <= earlier, f"{entry.name}= uses an option after it"
        assert entry.parse is not None or not entry.uses, entry.name
        earlier.add(entry.key)


def _scalar(kind: Any) -> Any:
    """``int`` of ``int | None``."""
    if isinstance(kind, types.UnionType):
        (kind,) = (part for part in get_args(kind) if part is not type(None))
    return kind


def test_the_estimators_params_are_the_tables_where_they_share_an_option():
    from pyspark.ml.param import TypeConverters

    from hvd_magic.spark.params import EstimatorParams

    converters = {int: TypeConverters.toInt, float: TypeConverters.toFloat, str: TypeConverters.toString}
    params = EstimatorParams()
    for entry in OPTIONS:
        if ESTIMATORS not in entry.where:
            continue
        keyword = entry.keyword_at(ESTIMATORS)
        name = keyword.name or entry.key
        if entry.key in NOT_PARAMS:
            assert not params.hasParam(name), name
            continue
        param = params.getParam(name)
        assert param.typeConverter is converters[_scalar(keyword.kind)], name
        default = params.getOrDefault(name) if params.hasDefault(name) else None
        assert default == (None if keyword.default is REQUIRED else keyword.default), name


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
    assert normalize_line("np=-2 return=a,b") == ["--np=-2", "--return=a,b"]
    assert normalize_line("-np 3") == ["--np", "3"]
    with pytest.raises(UsageError, match="the options are: np, launcher, backend"):
        normalize_line("np=2 nproc=2")


def test_every_place_is_named_in_the_table():
    assert set(PLACES) >= {place for entry in OPTIONS for place in entry.where}


def test_a_value_is_read_as_the_shell_would_and_reaches_the_option_whole(ip):
    """Quotes, ``~``, ``*`` and letters beyond ASCII reach the option as written (argparse
    once saw the shell's quotes kept: "unrecognized arguments"); ``--env A=1`` too."""
    magics = ip.find_cell_magic("horovod").__self__
    args = magics._parse(
        "np=-2 checkpoint_dir=~/ck timeline='/tmp/my file.json' env=\"A=hello world\" data=données"
    )
    assert (args.checkpoint_dir, args.timeline, args.env, args.data) == (
        "~/ck",
        "/tmp/my file.json",
        "A=hello world",
        "données",
    )
    assert magics._parse("np=-2 --env X=a*b,CUDA_VISIBLE_DEVICES=0,1").env == "X=a*b,CUDA_VISIBLE_DEVICES=0,1"
    assert normalize_line("--checkpoint_dir ~/checkpoint_dir np=-2") == [  # a value is not an option
        "--checkpoint_dir",
        "~/checkpoint_dir",
        "--np=-2",
    ]
