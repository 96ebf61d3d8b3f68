"""The checks made before a Spark launch: dynamic allocation (which barrier mode refuses) on a
real local-cluster, told before anything starts; the rule itself, pure; a cancel by tag that
returns at its bound whatever Spark does."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from hvd_magic import HorovodRunner, LaunchError
from hvd_magic.launch import spark_session as sessions
from hvd_magic.launch.spark_session import dynamic_allocation_on

from .helpers import run_processes_anywhere
from .spark_fixtures import spark_session


@pytest.mark.parametrize(
    ("master", "enabled", "on"),
    [
        ("local-cluster[2,1,1024]", "true", True),
        ("spark://10.0.0.1:7077", "True ", True),
        ("yarn", "false", False),
        ("yarn", None, False),
        ("local[4]", "true", False),  # Spark ignores it in local mode
        ("local", "true", False),
    ],
)
def test_dynamic_allocation_as_spark_applies_it(master, enabled, on):
    assert dynamic_allocation_on(master, enabled) is on


@pytest.fixture(scope="module")
def dynamic():
    conf = {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "1",
    }
    # no worker: Spark refuses the barrier stage as it submits it, and hvd_magic before that
    with spark_session("local-cluster[0,1,1024]", conf) as session:
        yield session


def test_dynamic_allocation_is_refused_before_launch_with_what_to_change(dynamic):
    # What Spark itself says of a barrier stage here, so the check mirrors a real refusal.
    with pytest.raises(Exception, match="dynamic resource allocation"):
        dynamic.sparkContext.parallelize(range(1), 1).barrier().mapPartitions(lambda rows: rows).collect()
    with pytest.raises(LaunchError) as info:
        HorovodRunner(np=1).run(lambda: 1)
    assert "spark.dynamicAllocation.enabled=false" in str(info.value)
    assert run_processes_anywhere() == []


def test_the_embedded_sessions_jvm_output_stays_out_of_the_cell(tmp_path):
    import os
    import re

    from jupyter_client.manager import start_new_kernel

    from .kernels import Kernel

    # as a user's kernel: no Spark set up at all (the executors must find this Python themselves)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=env)
    kernel = Kernel(manager, client)
    try:
        assert kernel.run("%load_ext hvd_magic").status == "ok"
        outcome = kernel.run("%%horovod np=2\n1 + 1")  # no active session: the embedded one starts
        assert (outcome.status, outcome.value) == ("ok", "2"), outcome
        shown = "".join(outcome.shown)
        for noise in ("log4j", "NativeCodeLoader", "WARN"):
            assert noise not in shown, shown
        found = re.search(r"its JVM log: (\S+?\.log)", shown)
        assert found is not None, shown
        with open(found[1], encoding="utf-8") as log:
            assert "log4j" in log.read()  # the JVM's start-up lines went there instead
        again = kernel.run("%%horovod np=2\n3")
        assert again.value == "3" and "JVM log" not in "".join(again.shown)  # told once
        master = kernel.run(
            "from pyspark.sql import SparkSession\nSparkSession.getActiveSession().sparkContext.master"
        )
        assert master.value.startswith("'local["), master  # a local Spark of this machine
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert run_processes_anywhere() == []


def test_shards_go_where_spark_keeps_the_executors_scratch_files(tmp_path, monkeypatch):
    import tempfile

    from hvd_magic.data.files import SCRATCH_VARIABLES, scratch_dir

    for name, _ in SCRATCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert scratch_dir() == tempfile.gettempdir()
    yarn, standalone = tmp_path / "yarn", tmp_path / "worker"
    standalone.mkdir()
    monkeypatch.setenv("SPARK_EXECUTOR_DIRS", f"{tmp_path / 'gone'}:{standalone}")
    assert scratch_dir() == str(standalone)  # the first one that exists
    yarn.mkdir()
    monkeypatch.setenv("LOCAL_DIRS", f"{yarn},{standalone}")
    assert scratch_dir() == str(yarn)  # YARN's first, as Spark orders them


class _Answering:
    def __init__(self, answer: threading.Event | Exception | None) -> None:
        self.answer, self.asked = answer, []

    def interruptTag(self, tag: str) -> list[str]:  # noqa: N802 - Spark's name
        self.asked.append(tag)
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer is not None:
            self.answer.wait()  # a Connect server that does not answer: its client retries for minutes
        return []


def test_a_session_stopped_under_a_run_tells_no_executor_lost_or_leaving():
    """The supervision asks once a second; a session another thread stopped must not raise
    there (its SparkContext has no JVM side left), or it would hide the run's own error."""
    stopped = SimpleNamespace(sparkContext=SimpleNamespace(_jsc=None))
    assert sessions.decommissioned(stopped, ["0", "1"]) == []
    assert sessions.lost_executors(stopped, ["0", "1"]) == {}
    assert sessions.described(stopped) == "Spark"  # what a run's record says launched it


def test_a_cancel_by_tag_is_bounded_whatever_spark_does():
    answers = _Answering(None)
    assert sessions.cancel_tag(answers, "run-1", timeout=30) and answers.asked == ["run-1"]
    began = time.monotonic()
    assert not sessions.cancel_tag(_Answering(RuntimeError("session stopped")), "run-2", timeout=30)
    assert time.monotonic() - began < 25  # a failed cancel returns at once, not at its bound
    never = threading.Event()
    began = time.monotonic()
    assert not sessions.cancel_tag(_Answering(never), "run-3", timeout=0.5)
    assert time.monotonic() - began < 30  # returned at its bound, not when Spark answers
    never.set()


def test_an_interrupt_before_any_task_began_cancels_the_stage_at_once(monkeypatch):
    """The stage waits for slots (a busy cluster) and the cell is interrupted: the stop waited
    12 s for confirmations no task could send, then 10 s for the job, before Spark was told to
    cancel. Spark's side is a stand-in here: a session whose stage ends when its tag is cancelled."""
    from hvd_magic.hub import Hub
    from hvd_magic.launch.spark import SparkLauncher

    monkeypatch.setenv("HVD_MAGIC_DRIVER_HOST", "127.0.0.1")
    cancelled = threading.Event()
    session = SimpleNamespace(
        conf=SimpleNamespace(get=lambda key, default=None: default),
        addTag=lambda tag: None,
        removeTag=lambda tag: None,
        interruptTag=lambda tag: cancelled.set() or [],
    )

    class WaitingStage:
        def collect(self) -> None:
            cancelled.wait(120)
            raise RuntimeError("Job 1 cancelled part of cancelled job tag")

    launcher = SparkLauncher(2, "gloo", session)
    launcher.hub = Hub("127.0.0.1", b"")
    try:
        launcher._job.start(WaitingStage, lambda: launcher._ending is not None, lambda stage: None)
        began = time.monotonic()
        assert launcher.stop() is not None
        assert cancelled.is_set() and time.monotonic() - began < 8  # not 22 s: told at once
    finally:
        launcher.hub.close()
