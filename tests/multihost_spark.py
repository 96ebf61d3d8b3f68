"""Spark standalone on the multi-host bed, and the notebook's kernel on a host of its own.

Each host has its own port space, so every daemon listens on Spark's usual ports at its
host's address. The test process reaches the master's web UI and the kernel only through the
bridge (never through a proxy: the opener below has none)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from . import spark_jvm
from .kernels import Kernel
from .multihost_hosts import BED_DIR, Bed

SPARK_HOME = Path(importlib.util.find_spec("pyspark").origin).parent  # type: ignore[arg-type, union-attr]
MASTER_PORT, MASTER_WEB_PORT, WORKER_WEB_PORT = 7077, 8080, 8081
SHELL_PORT = 50001  # and the next four: iopub, stdin, control, heartbeat
START_SECONDS = 90.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # bed addresses only

SESSION_CELL = """
from pyspark.sql import SparkSession
spark = (
    SparkSession.builder.master({master!r}).appName("hvd_magic-multihost")
    .config("spark.driver.host", {ip!r})
    .config("spark.executor.cores", "{cores}").config("spark.cores.max", "{slots}")
    .config("spark.executor.memory", "512m").config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false").config("spark.decommission.enabled", "true")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
"""
# Executors register after the application: wait for them (bounded) before any test runs.
EXECUTORS_CELL = """
import time as _time
_deadline = _time.monotonic() + {timeout}
while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < {count}:
    assert _time.monotonic() < _deadline, "the executors did not register within {timeout} s"
    _time.sleep(0.2)
spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
"""


def spark_env(ip: str) -> dict[str, str]:
    return {
        "SPARK_HOME": str(SPARK_HOME),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": ip,
        **spark_jvm.environment(),  # the suite's JVM options and class archive (in the image)
        "SPARK_WORKER_OPTS": "-Dspark.decommission.enabled=true",  # SIGPWR: a graceful leave
    }


def wait_for_port(
    ip: str, port: int, what: str, process: subprocess.Popen[bytes], timeout: float = START_SECONDS
) -> None:
    """Until ``process`` listens on ``ip:port``; an error if it ends or takes over ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{what} ended (code {process.returncode}) before it listened") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not listen on {ip}:{port} within {timeout:.0f} s") from None
            time.sleep(0.1)


def start_spark(bed: Bed, master: str, workers: list[str], cores: int, log_dir: Path) -> str:
    """The master on host ``master``, then one worker per host (started together once the
    master listens: a worker that finds no master retries only 5-15 s later)."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    ip = bed.host(master).ip
    argv = [spark_class, "org.apache.spark.deploy.master.Master", "--host", ip, "--port", str(MASTER_PORT)]
    log = log_dir / "master.log"
    process = bed.spawn(master, [*argv, "--webui-port", str(MASTER_WEB_PORT)], log, spark_env(ip))
    url = f"spark://{ip}:{MASTER_PORT}"
    wait_for_port(ip, MASTER_PORT, f"the Spark master on {master} (log: {log})", process)
    for name in workers:
        start_worker(bed, name, url, cores, log_dir)
    return url


def start_worker(bed: Bed, name: str, master_url: str, cores: int, log_dir: Path) -> subprocess.Popen[bytes]:
    """The Spark worker of host ``name`` (not waited for)."""
    worker_ip = bed.host(name).ip
    argv = [
        str(SPARK_HOME / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
        "--host", worker_ip, "--cores", str(cores), "--memory", "1g",
        "--webui-port", str(WORKER_WEB_PORT), "--work-dir", "/tmp/spark-work", master_url,
    ]  # fmt: skip
    return bed.spawn(name, argv, log_dir / f"worker-{name}.log", spark_env(worker_ip))


def alive_workers(master_ip: str) -> list[str]:
    """The hosts of the workers the master sees alive ([] if it does not answer)."""
    try:
        with _DIRECT.open(f"http://{master_ip}:{MASTER_WEB_PORT}/json", timeout=2) as answer:
            state = json.load(answer)
    except (OSError, ValueError):  # not listening yet, or a half-written answer while it starts
        return []
    return sorted(w["host"] for w in state.get("workers", []) if w["state"] == "ALIVE")


def app_cores(master_ip: str) -> int:
    """The cores the master granted the running applications (0 if it does not answer)."""
    try:
        with _DIRECT.open(f"http://{master_ip}:{MASTER_WEB_PORT}/json", timeout=2) as answer:
            state = json.load(answer)
    except (OSError, ValueError):
        return 0
    return sum(int(app.get("cores", 0)) for app in state.get("activeapps", []))


def wait_for_workers(master_ip: str, count: int, log_dir: Path, timeout: float = START_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while len(alive_workers(master_ip)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} Spark workers did not register within {timeout:.0f} s ({log_dir})")
        time.sleep(0.2)


def start_kernel(bed: Bed, host: str, log_dir: Path) -> tuple[Kernel, subprocess.Popen[bytes]]:
    """An IPython kernel on ``host`` (the notebook: Spark's driver), reached through the bridge."""
    ip = bed.host(host).ip
    connection = BED_DIR / f"kernel-{host}.json"  # on the machine's disk: the kernel reads it
    shell, iopub, stdin, control, heartbeat = range(SHELL_PORT, SHELL_PORT + 5)
    key = secrets.token_hex(16).encode()
    write_connection_file(str(connection), shell, iopub, stdin, heartbeat, control, ip=ip, key=key)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection)]
    env = spark_env(ip)
    del env["SPARK_LOCAL_IP"]  # the driver's address is spark.driver.host, as a notebook sets it
    log = log_dir / f"kernel-{host}.log"
    process = bed.spawn(host, argv, log, env)
    # Without a manager, the client takes a heartbeat not yet answered for a dead kernel.
    wait_for_port(ip, heartbeat, f"the kernel on {host} (log: {log})", process)
    client = BlockingKernelClient(connection_file=str(connection))
    client.load_connection_file()
    client.start_channels()
    client.wait_for_ready(timeout=START_SECONDS)
    return Kernel(None, client), process


def start_session(kernel: Kernel, bed: Bed, master_url: str, driver: str, slots: int, cores: int) -> None:
    """``spark`` in the kernel: an application on the bed's master with ``slots`` executor
    cores, ``cores`` per executor, once its executors registered."""
    ip = bed.host(driver).ip
    cell = SESSION_CELL.format(master=master_url, ip=ip, cores=cores, slots=slots)
    started = kernel.run(cell, timeout=START_SECONDS)
    assert started.status == "ok", f"the SparkSession did not start: {started.ename}: {started.evalue}"
    ready = kernel.run(EXECUTORS_CELL.format(count=slots // cores, timeout=START_SECONDS), timeout=120)
    assert ready.status == "ok", f"{ready.ename}: {ready.evalue}"


def stop_kernel(kernel: Kernel, process: subprocess.Popen[bytes]) -> None:
    """The kernel and what it started (Spark's driver JVM), in the order a shutdown takes."""
    kernel.client.stop_channels()
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for member in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _, alive = psutil.wait_procs(tree, timeout=10)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    process.wait(timeout=10)
