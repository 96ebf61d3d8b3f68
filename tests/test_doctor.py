"""doctor: every check passes on this machine and on a real local-cluster; each failure is
provoked for real once (no mpirun on PATH, executors with another Python, executors that cannot
reach the notebook, GPUs the tasks do not ask for) and names its fix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from hvd_magic.doctor import checks, doctor
from hvd_magic.doctor import spark as doctor_spark
from hvd_magic.doctor.spark import ReachListener

from .helpers import free_port
from .spark_fixtures import fake_gpu_script, spark_session


def run_doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvd_magic", "doctor", *args],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300,
    )  # fmt: skip


def test_every_check_passes_here(without_binding_probes, capsys):
    """The verdict when nothing fails; this machine's bindings pass in the executors' test, whose
    doctor (a process of its own, as users run it) fails only on the executors' Python."""
    from hvd_magic.__main__ import main

    assert main(["doctor"]) == 0
    printed = capsys.readouterr().out
    assert "✓ mpirun" in printed and "✓ hvd_magic" in printed
    assert printed.rstrip().endswith("all checks passed")


def test_no_mpirun_on_path_is_named_with_its_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # (a failing doctor's exit code: see the executors' test)
    check = checks.mpirun_check()
    assert f"{check.mark} {check.name}" == "✗ mpirun" and check.detail == "not found on PATH"
    assert "openmpi-bin" in check.fix and "launcher=gloo" in check.fix


@pytest.mark.parametrize("module", ["_scan", "_match"])
def test_a_missing_compiled_timeline_part_is_told_not_failed(module, monkeypatch):
    monkeypatch.setitem(sys.modules, f"hvd_magic.timeline.{module}", None)  # its import now fails
    check = checks.hvd_magic_check()
    assert check.ok is None  # optional: runs work without it
    assert "missing the compiled timeline scanner (the pure-Arrow reader is used" in check.detail
    assert "C compiler" in check.fix


class ClassicSession:
    """What doctor's session checks read of a classic session: its version and its conf."""

    version = "4.1.0"

    def __init__(self, **conf: str) -> None:
        self.conf = self
        self._conf = {key.replace("_", "."): value for key, value in conf.items()}

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._conf.get(key, default)


def test_dynamic_allocation_is_named_with_its_fix_where_spark_applies_it():
    on = {"spark_dynamicAllocation_enabled": "true"}
    rows = doctor_spark.session_checks(ClassicSession(spark_master="local-cluster[2,1,1024]", **on), 2)
    row = next(check for check in rows if check.name == "dynamic allocation")
    assert row.ok is False and row.detail == "on"
    assert "spark.dynamicAllocation.enabled=false" in row.fix and "barrier mode refuses it" in row.fix
    rows = doctor_spark.session_checks(ClassicSession(spark_master="local[2]", **on), 2)
    assert next(check for check in rows if check.name == "dynamic allocation").ok  # local mode ignores it


def test_executors_with_another_python_are_named_with_their_fix(tmp_path):
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = run_doctor(
        "--spark", "local-cluster[1,1,1024]",
        env={"PYSPARK_PYTHON": str(bare / "bin" / "python"), "SPARK_LOCAL_IP": "127.0.0.1"},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    failed = [line for line in done.stdout.splitlines() if line.startswith("✗")]
    assert len(failed) == 1 and "executors' Python" in failed[0], done.stdout  # the one failure
    assert f"({bare}/bin/python): hvd_magic missing, horovod missing" in failed[0]
    assert "1 check(s) failed" in done.stdout
    # this machine's own checks, the bindings' import probes among them, passed
    assert (
        "✓ mpirun" in done.stdout
        and "✓ horovod.torch" in done.stdout
        and "✓ horovod.tensorflow" in done.stdout
    )
    assert "spark.pyspark.python / PYSPARK_PYTHON" in done.stdout
    assert "✓ executors reach the notebook" in done.stdout  # the check ran without hvd_magic there


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    gpus = fake_gpu_script(tmp_path_factory.mktemp("gpu"), ["0"])
    conf = {  # executors with a GPU, tasks that ask for none: the ranks would share it
        "spark.worker.resource.gpu.amount": "1",
        "spark.worker.resource.gpu.discoveryScript": str(gpus),
        "spark.executor.resource.gpu.amount": "1",
        "spark.executor.resource.gpu.discoveryScript": str(gpus),
    }
    with spark_session("local-cluster[2,1,1024]", conf) as session:
        yield session


@pytest.fixture
def without_binding_probes(monkeypatch):
    """The cluster's tests leave out the Horovod bindings' import probes (seconds of CPU each):
    test_every_check_passes_here and the executors'-Python test (the CLI) run them."""
    monkeypatch.setattr(checks, "horovod_checks", lambda: [])


def by_name(report):
    return {check.name: check for check in report.checks}


def test_a_cluster_is_checked_end_to_end(cluster, without_binding_probes):
    """The Spark side, end to end (this machine's bindings: test_every_check_passes_here)."""
    report = doctor(cluster)
    rows = by_name(report)
    assert rows["Spark session"].detail.startswith("classic, Spark ")
    python = rows.get("executors' Python")
    assert python is not None and python.ok, report.checks
    assert f"python {sys.version_info.major}.{sys.version_info.minor}," in python.detail
    assert rows["executors reach the notebook"].ok
    assert rows["dynamic allocation"].ok
    gpus = rows["GPUs"]
    assert gpus.ok is False and "spark.task.resource.gpu.amount=1" in gpus.fix


def test_executors_still_registering_are_waited_for(cluster, without_binding_probes, monkeypatch):
    """A session that has just started has no executors yet: the doctor waits for them rather
    than skipping the executors' checks."""
    real = doctor_spark.sessions.slots_available
    calls = []

    def registering(session):
        calls.append(1)
        return 0 if len(calls) <= 3 else real(session)

    monkeypatch.setattr(doctor_spark.sessions, "slots_available", registering)
    rows = by_name(doctor(cluster))
    assert len(calls) > 3 and rows["task slots"].ok
    assert rows["executors' Python"].ok and rows["executors reach the notebook"].ok


def test_executors_that_cannot_reach_the_notebook_are_named_with_the_fix(
    cluster, without_binding_probes, monkeypatch
):
    closed = free_port()
    real_init = ReachListener.__init__

    def behind_a_firewall(self, host):  # the listener is up, but not where the executors connect
        real_init(self, host)
        self.address = f"127.0.0.1:{closed}"

    monkeypatch.setattr(doctor_spark.ReachListener, "__init__", behind_a_firewall)
    check = by_name(doctor(cluster))["executors reach the notebook"]
    assert check.ok is False and f"not at 127.0.0.1:{closed}" in check.detail
    assert "refused" in check.detail.lower()
    assert "HVD_MAGIC_DRIVER_HOST" in check.fix


def test_the_listener_answers_only_its_token():
    listener = ReachListener("127.0.0.1")
    host, port = listener.address.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)), timeout=10)  # says nothing: holds no one up
    try:
        for token, answer in (
            (b"forged", b""),
            (b"\x16\x03\x01\xff\xfe", b""),
            (listener.token.encode(), b"ok\n"),
        ):
            with socket.create_connection((host, int(port)), timeout=10) as peer:
                peer.settimeout(10)
                peer.sendall(token + b"\n")
                assert peer.recv(16) == answer
    finally:
        silent.close()
        listener.close()


def test_the_magic_shows_the_table(ip, without_binding_probes):
    report = ip.run_line_magic("horovod_doctor", "")
    html = report._repr_html_()
    assert "<table class='hvd-doctor'>" in html and "mpirun" in html
