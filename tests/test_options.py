"""Run options: ``key=value`` text from the magic line, or HorovodRunner keywords."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hvd_magic.options import OptionError, RunOptions, cell_options, make_options
from hvd_magic.options import parse as options
from hvd_magic.options.folders import full_location, parse_checkpoint_dir
from hvd_magic.options.local_ranks import check_local_ranks
from hvd_magic.options.parse import (
    parse_env,
    parse_launcher,
    parse_names,
    parse_np,
    parse_timeline,
    parse_timeout,
)


@pytest.fixture
def no_mpirun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options.shutil, "which", lambda name: None)


@pytest.fixture
def with_mpirun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options.shutil, "which", lambda name: "/usr/bin/mpirun" if name == "mpirun" else None)


# --- make_options ------------------------------------------------------------------------------


def test_make_options_parses_every_field(no_mpirun: None, tmp_path: Path) -> None:
    target = tmp_path / "t.json"
    opts = make_options(
        np="-2",
        launcher="gloo",
        env="A=1,B=x=y",
        return_names="model, loss",
        timeout="30",
        timeline=str(target),
    )
    assert opts == RunOptions(
        np=-2,
        launcher="gloo",
        env={"A": "1", "B": "x=y"},
        return_names=["model", "loss"],
        timeout=30.0,
        timeline=str(target),
        mark_cycles=False,
    )


def test_make_options_defaults(no_mpirun: None) -> None:
    opts = make_options(np=4)
    assert opts == RunOptions(np=4, launcher="gloo")
    assert opts.env == {} and opts.return_names == []
    assert opts.timeout is None and opts.timeline is None and opts.mark_cycles is False


def test_make_options_refuses_a_bad_option() -> None:
    with pytest.raises(OptionError, match="timeout"):
        make_options(np=2, launcher="gloo", timeout="-1")


def test_make_options_refuses_a_keyword_no_option_has() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'nproc'"):
        make_options(np=2, nproc=2)


def test_a_session_cell_keeps_the_sessions_stragglers_and_timeout_and_takes_its_own(no_mpirun: None) -> None:
    session = make_options(np=-2, stragglers="0.5/20", timeout=30, env="A=1")
    cell = cell_options(session, {"return_names": "a,b", "ranks": [0]})
    assert cell.stragglers == session.stragglers and cell.env == {"A": "1"}
    assert cell.return_names == ["a", "b"] and cell.timeout == 30  # the session's, for every cell
    assert cell_options(session, {"stragglers": "off", "timeout": "5"}).stragglers is None
    assert cell_options(session, {"timeout": "5"}).timeout == 5.0


def test_option_error_is_a_value_error() -> None:
    # HorovodRunner callers catch ValueError; the magic turns OptionError into a UsageError.
    assert issubclass(OptionError, ValueError)


@pytest.mark.parametrize(("np", "ranks"), [(-3, 3), (3, 3), (-1, 1), (16, 16)])
def test_ranks_is_abs_np(np: int, ranks: int) -> None:
    assert RunOptions(np=np).ranks == ranks


# --- np ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("4", 4), ("-2", -2), (3, 3), (" 5 ", 5)])
def test_parse_np_accepts_whole_numbers(value: object, expected: int) -> None:
    assert parse_np(value) == expected


@pytest.mark.parametrize("value", [0, "0", "-0"])
def test_parse_np_refuses_zero_with_advice(value: object) -> None:
    with pytest.raises(OptionError) as info:
        parse_np(value)
    message = str(info.value)
    assert "must not be 0" in message
    assert "np=-N" in message and "this machine" in message
    assert "np=N" in message and "Spark" in message


@pytest.mark.parametrize("value", ["four", "2.5", "", "1e3", None])
def test_parse_np_refuses_non_numbers(value: object) -> None:
    with pytest.raises(OptionError, match="whole number") as info:
        parse_np(value)
    assert repr(value) in str(info.value)


# --- env ---------------------------------------------------------------------------------------


def test_parse_env_string_form() -> None:
    assert parse_env("A=1,B_2=two,EMPTY=") == {"A": "1", "B_2": "two", "EMPTY": ""}


def test_parse_env_value_may_contain_equals_and_key_is_stripped() -> None:
    assert parse_env(" KEY =a=b") == {"KEY": "a=b"}


def test_parse_env_value_may_hold_commas() -> None:
    """A comma not followed by KEY= is the value's own: a device list, interfaces."""
    assert parse_env("CUDA_VISIBLE_DEVICES=0,1,NCCL_SOCKET_IFNAME=eth0,eth1,A=2") == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_SOCKET_IFNAME": "eth0,eth1",
        "A": "2",
    }


def test_parse_env_dict_form_stringifies() -> None:
    assert parse_env({"A": 1, 2: "x"}) == {"A": "1", "2": "x"}  # type: ignore[dict-item]


@pytest.mark.parametrize("empty", [None, "", {}])
def test_parse_env_empty(empty: object) -> None:
    assert parse_env(empty) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("NOEQUALS,A=1", "NOEQUALS"),
        ("A=1,1X=2", "1X=2"),
        ("A=1,=v", "=v"),
        ("MY-VAR=1", "MY-VAR=1"),
        ("A=1,", ""),
    ],
)
def test_parse_env_names_the_bad_item(text: str, bad: str) -> None:
    with pytest.raises(OptionError, match="KEY=VALUE") as info:
        parse_env(text)
    assert repr(bad) in str(info.value)


# --- return names ------------------------------------------------------------------------------


def test_parse_names_string_and_list() -> None:
    assert parse_names("a, b ,c") == ["a", "b", "c"]
    assert parse_names(["model", "history"]) == ["model", "history"]
    assert parse_names(None) == [] and parse_names("") == []


def test_parse_names_lists_every_bad_name() -> None:
    with pytest.raises(OptionError, match="not names") as info:
        parse_names("ok, 1bad, a.b, fine")
    message = str(info.value)
    assert "'1bad'" in message and "'a.b'" in message
    assert "'ok'" not in message and "'fine'" not in message


# --- launcher ----------------------------------------------------------------------------------


def test_parse_launcher_defaults_to_mpi_when_mpirun_is_on_path(with_mpirun: None) -> None:
    assert parse_launcher(None) == "mpi"


def test_parse_launcher_defaults_to_gloo_without_mpirun(no_mpirun: None) -> None:
    assert parse_launcher(None) == "gloo"


def test_parse_launcher_default_follows_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert parse_launcher(None) == "gloo"
    mpirun = tmp_path / "mpirun"
    mpirun.write_text("#!/bin/sh\n")
    mpirun.chmod(0o755)
    assert parse_launcher(None) == "mpi"


def test_parse_launcher_explicit_choice_wins(with_mpirun: None) -> None:
    assert parse_launcher("gloo") == "gloo"
    assert parse_launcher("mpi") == "mpi"


@pytest.mark.parametrize("value", ["MPI", "nccl", ""])
def test_parse_launcher_refuses_others(value: str) -> None:
    with pytest.raises(OptionError, match="mpi or gloo") as info:
        parse_launcher(value)
    assert repr(value) in str(info.value)


# --- timeout -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("30", 30.0), ("0.5", 0.5), (10, 10.0), (None, None)])
def test_parse_timeout_accepts_positive_seconds(value: object, expected: float | None) -> None:
    assert parse_timeout(value) == expected


@pytest.mark.parametrize("value", ["0", 0, "-5", -0.1])
def test_parse_timeout_refuses_non_positive(value: object) -> None:
    with pytest.raises(OptionError, match="must be positive"):
        parse_timeout(value)


@pytest.mark.parametrize("value", ["soon", "", "10s", "nan", "inf"])
def test_parse_timeout_refuses_non_numbers(value: object) -> None:
    with pytest.raises(OptionError, match="number of seconds") as info:
        parse_timeout(value)
    assert repr(value) in str(info.value)


# --- timeline ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "cycles"),
    [("on", False), ("yes", False), ("true", False), ("cycles", True), ("On", False), ("YES", False)]
    + [(True, False), ("Cycles", True)],
)
def test_parse_timeline_on_makes_a_new_file_in_cwd(
    value: str | bool, cycles: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    path, mark_cycles = parse_timeline(value)
    assert path is not None
    assert os.path.isabs(path)
    assert os.path.dirname(path) == os.getcwd()
    name = os.path.basename(path)
    assert name.startswith("horovod_timeline-") and name.endswith(".json")
    assert mark_cycles is cycles


@pytest.mark.parametrize("value", [None, "off", "no", "false", "", "Off", "NO", "False", False])
def test_parse_timeline_off(value: str | bool | None) -> None:
    assert parse_timeline(value) == (None, False)


def test_parse_timeline_relative_path_becomes_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    path, mark_cycles = parse_timeline("sub/t.json")
    assert path == os.path.join(os.getcwd(), "sub", "t.json")
    assert mark_cycles is False


def test_parse_timeline_refuses_a_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(OptionError, match="does not exist") as info:
        parse_timeline(str(missing / "t.json"))
    assert str(missing) in str(info.value)


def test_make_options_timeline_cycles(
    no_mpirun: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    opts = make_options(np=-2, timeline="cycles")
    assert opts.mark_cycles is True
    assert opts.timeline is not None and os.path.dirname(opts.timeline) == os.getcwd()


@pytest.mark.parametrize(
    ("np", "cores", "oversubscribe", "outcome"),
    [
        (-2, 2, False, "quiet"),
        (-3, 2, False, "notice"),
        (-8, 2, False, "notice"),  # four a core: still taken
        (-9, 2, False, "refused"),
        (-1000, 2, False, "refused"),
        (-1000, 2, True, "quiet"),  # the user insisted
        (1000, 2, False, "quiet"),  # Spark ranks: the cluster's slots decide
    ],
)
def test_local_ranks_against_the_cores(np: int, cores: int, oversubscribe: bool, outcome: str) -> None:
    if outcome == "refused":
        with pytest.raises(options.OptionError, match=f"which has {cores} CPU cores"):
            check_local_ranks(np, oversubscribe, cores)
        return
    notices = check_local_ranks(np, oversubscribe, cores)
    assert len(notices) == (1 if outcome == "notice" else 0)


def test_horovod_runner_refuses_a_typo_np_as_a_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from hvd_magic import HorovodRunner

    monkeypatch.setattr("hvd_magic.options.local_ranks.machine_cores", lambda: 2)
    with pytest.raises(ValueError, match="oversubscribe=True"):
        HorovodRunner(np=-1000)
    assert HorovodRunner(np=-1000, oversubscribe=True).num_processor == 1000


# --- places for files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("dbfs:/models/m", "/dbfs/models/m"),
        ("file:/tmp/x", "/tmp/x"),
        ("hdfs:/user/me/ck", "hdfs:///user/me/ck"),
        ("s3://bucket/key", "s3://bucket/key"),
        ("file:///tmp/x", "file:///tmp/x"),
        ("C:/data", "C:/data"),
        ("runs/mnist", "runs/mnist"),
    ],
)
def test_a_url_with_one_slash_is_a_url_not_a_relative_folder(given: str, read: str) -> None:
    """dbfs:/, file:/ and hdfs:/ (as Spark writes them) made folders named 'dbfs:' in the cwd."""
    assert full_location(given) == read


def test_checkpoint_dir_and_logdir_read_one_slash_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_checkpoint_dir(f"file:{tmp_path}/ck") == f"{tmp_path}/ck"
    with pytest.raises(OptionError, match="checkpoint_dir=/dbfs/ck: neither it nor its folder /dbfs exists"):
        parse_checkpoint_dir("dbfs:/ck")  # not on Databricks: no mount
    assert not (tmp_path / "dbfs:").exists()
