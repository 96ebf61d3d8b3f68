"""Real Spark clusters for the tests: local-cluster (two executor JVMs) and standalone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import pyspark

SPARK_HOME = Path(pyspark.__file__).parent


def fake_gpu_script(directory: Path, addresses: list[str]) -> Path:
    script = directory / "gpus.sh"
    script.write_text(f"#!/bin/sh\necho '{json.dumps({'name': 'gpu', 'addresses': addresses})}'\n")
    script.chmod(0o755)
    return script


@contextmanager
def spark_session(master: str, conf: dict[str, str]) -> Iterator[object]:
    from pyspark.sql import SparkSession

    stop_shared()  # else getOrCreate would hand back the kept cluster, whatever ``master`` says
    os.environ["PYSPARK_PYTHON"] = sys.executable
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        **conf,
    }
    builder = SparkSession.builder.master(master).appName("hvd_magic-tests")
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        jvm = session.sparkContext._jvm
        session.stop()
        # Builder options become JVM system properties that outlive the session: clear them so
        # the next test module's session does not inherit them (fake GPUs, master).
        for key in [*settings, "spark.master", "spark.app.name"]:
            jvm.System.clearProperty(key)


# The clusters that several test modules share (their modules are one scheduling group, so they
# run one after the other on one xdist worker): made by the group's first module, kept for the
# next, stopped at the group's end (``conftest``: a later group must not find it active). One
# cluster instead of one each: its JVMs, its Python workers and the fork servers they keep.
TWO_EXECUTORS = "local-cluster[2,1,1024]"  # 2 slots: the estimators' and live sessions' modules
TWO_EXECUTORS_FOUR_GPUS = "local-cluster[2,2,1024]"  # 4 slots, a fake GPU each: launch and data=
BARRIER_FAILS_FAST = {"spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1"}
_shared = ExitStack()  # the kept cluster's session, stopped when closed
_kept: dict[str, Any] = {}  # its "key" (master and conf) and "session"


def gpu_conf(directory: Path) -> dict[str, str]:
    """Two fake GPUs an executor (``fake_gpu_script``), one a task; an executor decommissions
    itself on SIGPWR; a barrier stage short of slots fails at once."""
    directory.mkdir(parents=True, exist_ok=True)
    gpus = fake_gpu_script(directory, ["0", "1"])
    return {
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": str(gpus),
        "spark.executor.resource.gpu.amount": "2",
        "spark.executor.resource.gpu.discoveryScript": str(gpus),
        "spark.task.resource.gpu.amount": "1",
        "spark.decommission.enabled": "true",
        **BARRIER_FAILS_FAST,
    }


@contextmanager
def shared_spark_session(master: str, conf: dict[str, str]) -> Iterator[Any]:
    """A session on the cluster ``master`` with ``conf``, the one this worker keeps if it has it
    (and it is alive), else a new one that it keeps; stopped by :func:`stop_shared`."""
    key = (master, tuple(sorted(conf.items())))
    if _kept and (_kept["key"] != key or not _alive(_kept["session"])):
        stop_shared()
    if not _kept:
        _kept.update(key=key, session=_shared.enter_context(spark_session(master, conf)))
    try:
        yield _kept["session"]
    except BaseException:
        stop_shared()  # a module that failed with it (its slots never came, say): the next starts anew
        raise


def _alive(session: Any) -> bool:
    """Whether ``session``'s context is the active one and its JVM side is not stopped (Spark
    stops it itself when the master drops the application)."""
    from py4j.protocol import Py4JError
    from pyspark import SparkContext

    context = session.sparkContext
    if SparkContext._active_spark_context is not context or context._jsc is None:
        return False
    try:
        return not context._jsc.sc().isStopped()
    except Py4JError:
        return False


def stop_shared() -> None:
    """Stops the cluster this worker keeps for a group's modules, if any."""
    _kept.clear()
    _shared.close()


class Standalone:
    """A real Spark standalone master on 127.0.0.1 and one worker per address in ``worker_hosts``
    (``cores`` each): a worker can be lost for good (killed with its executors) and started again,
    as a host that goes and comes back."""

    def __init__(self, worker_hosts: list[str], cores: int, log_dir: Path) -> None:
        self.hosts, self.cores, self.log_dir = worker_hosts, cores, log_dir
        self.url, self.web_port = "", 0  # the master's, once it listens (``start``)
        self.env = dict(
            os.environ, SPARK_HOME=str(SPARK_HOME), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1"
        )
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.starts = 0

    def _start(self, argv: list[str], name: str, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"{name}.log", "a") as log:  # the child keeps its own copy
            return subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *argv],
                env=self.env | extra_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own: its executors go with it
            )

    def start(self) -> None:
        # Port 0 everywhere: each daemon binds a free port itself and the master's are read from
        # its log. A port picked here and handed over could be taken in between, and Spark would
        # then move to the next one silently. Its REST server (a fixed port, unused) stays off.
        master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0"]
        no_rest = {"SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        self.master = self._start([*master, "--webui-port", "0"], "master", no_rest)
        self.url, web = self._master_addresses(timeout=60)
        self.web_port = int(web)
        for host in self.hosts:
            self.start_worker(host)
        self.wait_for_workers(len(self.hosts))

    def _master_addresses(self, timeout: float) -> tuple[str, str]:
        """The master's URL and its web UI's port, from the lines its log says them in."""
        log, deadline = self.log_dir / "master.log", time.monotonic() + timeout
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            url = re.search(r"Starting Spark master at (spark://\S+)", text)
            web = re.search(r"Successfully started service 'MasterUI' on port (\d+)", text)
            if url and web:
                return url[1], web[1]
            assert self.master is not None and self.master.poll() is None, text[-3000:]
            assert time.monotonic() < deadline, f"no address said within {timeout:.0f} s: {text[-3000:]}"
            time.sleep(0.2)

    def start_worker(self, host: str) -> None:
        self.starts += 1
        self.workers[host] = self._start(
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host", host,
                "--cores", str(self.cores),
                "--memory", "1g",
                "--webui-port", "0",
                "--work-dir", str(self.log_dir / f"work-{self.starts}"),
                self.url,
            ],
            f"worker-{host}",
            {"SPARK_LOCAL_IP": host},
        )  # fmt: skip

    def lose_worker(self, host: str) -> None:
        """SIGKILL to the worker on ``host`` and everything under it, as a host that goes takes its
        processes with it: its executors, their Python workers and the ranks they started. The
        whole tree is stopped first (SIGSTOP, the worker before its children), so that a worker
        cannot start a new executor for one that died before it (it did, once)."""
        worker = psutil.Process(self.workers.pop(host).pid)
        worker.suspend()  # first: it can start nothing while its children are listed and stopped
        children = worker.children(recursive=True)
        for process in children:
            with suppress(psutil.NoSuchProcess):
                process.suspend()
        tree = [worker, *children]
        for process in tree:
            with suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(tree, timeout=30)

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json", timeout=2) as answer:
                state = json.load(answer)
        except (OSError, ValueError):  # not listening yet, or a half-written answer while it starts
            return 0
        return sum(w["state"] == "ALIVE" for w in state.get("workers", []))

    def wait_for_workers(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_workers() < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the standalone cluster had not {count} workers within {timeout:.0f} s")
            time.sleep(0.2)

    def stop(self) -> None:
        processes = [*self.workers.values(), *([self.master] if self.master else [])]
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


@contextmanager
def standalone_cluster(worker_hosts: list[str], cores: int, log_dir: Path) -> Iterator[Standalone]:
    """A :class:`Standalone` cluster, started, and stopped on the way out."""
    cluster = Standalone(worker_hosts, cores, log_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
