"""Real Spark clusters for the tests: local-cluster (two executor JVMs) and standalone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import pyspark

from .helpers import free_port

SPARK_HOME = Path(pyspark.__file__).parent


def fake_gpu_script(directory: Path, addresses: list[str]) -> Path:
    script = directory / "gpus.sh"
    script.write_text(f"#!/bin/sh\necho '{json.dumps({'name': 'gpu', 'addresses': addresses})}'\n")
    script.chmod(0o755)
    return script


@contextmanager
def spark_session(master: str, conf: dict[str, str]) -> Iterator[object]:
    from pyspark.sql import SparkSession

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


class Standalone:
    """A real Spark standalone master on 127.0.0.1 and one worker per address in ``worker_hosts``
    (``cores`` each): a worker can be lost for good (killed with its executors) and started again,
    as a host that goes and comes back."""

    def __init__(self, worker_hosts: list[str], cores: int, log_dir: Path) -> None:
        self.hosts, self.cores, self.log_dir = worker_hosts, cores, log_dir
        self.port, self.web_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
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
        master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port)]
        self.master = self._start([*master, "--webui-port", str(self.web_port)], "master", {})
        for host in self.hosts:
            self.start_worker(host)
        self.wait_for_workers(len(self.hosts))

    def start_worker(self, host: str) -> None:
        self.starts += 1
        self.workers[host] = self._start(
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host", host,
                "--cores", str(self.cores),
                "--memory", "1g",
                "--webui-port", str(free_port()),
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
