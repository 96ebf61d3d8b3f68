"""The suite's own schedule (``tests/scheduling.py``): which group a test runs in, the order the
groups start in, and what a recording keeps."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from . import scheduling


def test_a_module_is_a_group_but_notebooks_are_one_each_and_the_timeline_and_waiting_modules_share_one() -> (
    None
):
    assert scheduling.group_of("tests/test_magic.py::test_x[a]") == "tests/test_magic.py"
    notebook = "tests/test_examples.py::test_example_notebooks_run_headless[mnist_keras]"
    assert scheduling.group_of(notebook) == notebook
    assert scheduling.group_of("tests/test_timeline_magic.py::test_y") == "test_timeline"
    # the modules that share a Spark cluster: one group each cluster
    shared = {scheduling.group_of(f"tests/{m}.py::t") for m in ("test_launch_spark", "test_data_spark")}
    assert shared == {"spark-four-gpus"}
    standalone = "tests/test_launch_spark_standalone.py"
    assert scheduling.group_of(f"{standalone}::t") == standalone
    # the modules that mostly wait: one group, never two of them at once
    waiting = {scheduling.group_of(f"tests/{m}.py::t") for m in ("test_session", "test_stalls", "test_stop")}
    assert waiting == {scheduling.WAITING_GROUP}


def test_the_waiting_group_then_the_longest_start_first_and_a_groups_tests_keep_their_order(
    monkeypatch,
) -> None:
    known = {"tests/test_b.py": 100.0, "tests/test_a.py": 10.0, scheduling.WAITING_GROUP: 20.0}
    monkeypatch.setattr(scheduling, "known_seconds", lambda: known)
    ids = ["tests/test_a.py::one", "tests/test_c.py::one", "tests/test_b.py::one", "tests/test_a.py::two"]
    ids.append("tests/test_stalls.py::one")
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    scheduling.LongestFirst().pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        "tests/test_stalls.py::one",  # beside the longest groups, which use the cores it leaves
        "tests/test_b.py::one",
        "tests/test_a.py::one",
        "tests/test_a.py::two",
        "tests/test_c.py::one",  # unknown: counted as short
    ]


def test_a_recording_keeps_groups_it_did_not_run_and_drops_modules_that_are_gone(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    durations = tmp_path / "durations.json"
    durations.write_text(
        json.dumps({"tests/test_magic.py": 50.0, "tests/test_gone_long_ago.py": 80.0, "test_timeline": 9.0})
    )
    monkeypatch.setattr(scheduling, "DURATIONS", durations)
    monkeypatch.setattr(scheduling, "still_exists", lambda group: "gone" not in group)
    recorder = scheduling.DurationRecorder()
    for nodeid, seconds in [("tests/test_retry.py::a", 2.04), ("tests/test_retry.py::b", 3.0)]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))  # type: ignore[arg-type]
    recorder.pytest_sessionfinish(None)  # type: ignore[arg-type]
    assert json.loads(durations.read_text()) == {
        "tests/test_magic.py": 50.0,
        "test_timeline": 9.0,
        "tests/test_retry.py": 5.0,
    }


def test_the_groups_named_in_the_recorded_durations_exist() -> None:
    assert all(scheduling.still_exists(group) for group in scheduling.known_seconds())
    assert not scheduling.still_exists("tests/test_gone_long_ago.py")


def test_the_module_that_kills_an_executor_runs_last_in_its_clusters_group() -> None:
    """A group's modules run in file order; test_spark_sessions kills one of the cluster's
    executors, and a module after it would pay its executor's warm Python daemon and fork
    servers again."""
    group = [
        m for m, g in scheduling.SAME_CLUSTER.items() if g == scheduling.SAME_CLUSTER["test_spark_sessions"]
    ]
    assert sorted(group)[-1] == "test_spark_sessions"
