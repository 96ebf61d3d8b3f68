"""Real Spark clusters for the tests: local-cluster (two executor JVMs) and standalone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


def _wait_for_workers(web_port: int, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json", timeout=2) as answer:
                state = json.load(answer)
            if sum(w["state"] == "ALIVE" for w in state.get("workers", [])) >= count:
                return
        except (OSError, ValueError):  # not listening yet, or a half-written answer while it starts
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the standalone cluster did not get {count} workers within {timeout:.0f} s")


@contextmanager
def standalone_cluster(worker_hosts: list[str], cores: int, log_dir: Path) -> Iterator[str]:
    """A real Spark standalone master on 127.0.0.1 and one worker per address in ``worker_hosts``."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, web_port = free_port(), free_port()
    env = dict(
        os.environ, SPARK_HOME=str(SPARK_HOME), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1"
    )
    processes = []

    def start(argv: list[str], name: str, extra_env: dict[str, str]) -> None:
        log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        processes.append(
            subprocess.Popen(
                [spark_class, *argv],
                env=env | extra_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    master_argv = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
    start([*master_argv, "--webui-port", str(web_port)], "master", {})
    for index, host in enumerate(worker_hosts):
        start(
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host", host,
                "--cores", str(cores),
                "--memory", "1g",
                "--webui-port", str(free_port()),
                "--work-dir", str(log_dir / f"work-{index}"),
                f"spark://127.0.0.1:{port}",
            ],
            f"worker-{index}",
            {"SPARK_LOCAL_IP": host},
        )  # fmt: skip
    try:
        _wait_for_workers(web_port, len(worker_hosts))
        yield f"spark://127.0.0.1:{port}"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
