"""The suite's Spark JVMs: small, short-lived, and started from a class archive.

The suite starts some thirty Spark applications (drivers, executors, Connect servers,
standalone masters and workers) on two cores. Two things halve what each costs:

- C1 only and the serial collector: a small local-cluster spends about half the CPU getting up
  and through its work (22 s against 45 s, measured here); peak JIT speed never matters in runs
  this small.
- A dynamic class-data-sharing archive (JDK 13+, ``-XX:SharedArchiveFile``) of the classes a
  driver of a local-cluster loads (its in-process master and worker's among them): every JVM
  maps them instead of loading and verifying them anew. A local-cluster with two executors and
  a first job took 12 CPU-s instead of 22 here. The archive is made once per environment (a
  local-cluster job run with ``-XX:ArchiveClassesAtExit``) and kept beside pyspark's jars, in
  the virtual environment, under a name drawn from the JVM, the jars and the options; a JVM
  that cannot use it (another Java, other jars) runs without it, silently. A copy is kept in
  hvd_magic's cache (``spark-cds/``), as Horovod's wheel and the bytecode are, for the next fresh
  virtual environment: uv links its jars from one store, so they are the same files, with the same
  sizes and times, that the JVM checks an archive's jars against (the paths may differ: a clone
  elsewhere maps another clone's archive). Making it took 34 CPU-s of a fresh clone's set-up.

The JVMs take these options from a properties file (``--properties-file``, through
``PYSPARK_SUBMIT_ARGS``) and ``SPARK_DAEMON_JAVA_OPTS``, not from a ``SPARK_CONF_DIR``: Spark
puts that folder on every JVM's class path, and an archive refuses a class path with a
folder that is not empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark

# set-up's scripts/bytecode.py: how what is kept in the cache is placed and pruned (it also puts
# the checkout on the path, for set-up's run of this file before hvd_magic is installed)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bytecode import link, prune  # noqa: E402

from hvd_magic.install import default_cache  # noqa: E402 - the cache Horovod's wheel is kept in

__all__ = ["archive_path", "environment"]

JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a JVM that cannot use the archive says nothing
JARS = Path(pyspark.__file__).parent / "jars"
FOLDER = Path(sys.prefix) / "hvd_magic-spark-cds"
KEPT = default_cache() / "spark-cds"  # the archives kept for the next fresh environments
MAKE_SECONDS = 600  # one local-cluster job and the archive's dump, on a loaded machine

# What the archive's JVM does: a local-cluster (master, worker and an executor), a DataFrame, a
# barrier stage of Arrow batches through a Python worker, as the suite's runs do.
JOB = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local-cluster[1,1,1024]").appName("hvd_magic-tests-archive")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
frame = spark.range(64).repartition(1)
assert frame.mapInArrow(lambda batches: batches, frame.schema, barrier=True).count() == 64
assert spark.createDataFrame([(1, "a")], "n int, s string").toPandas().shape == (1, 2)
spark.stop()
"""


def _java() -> Path:
    home = os.environ.get("JAVA_HOME")
    found = Path(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found else Path("java")


def archive_path() -> Path:
    """Where the archive for this JVM, these jars and these options lives."""
    java = _java()
    key = hashlib.sha256()
    with contextlib.suppress(OSError):
        key.update(f"{java} {java.stat().st_mtime}".encode())
    for jar in sorted(JARS.glob("*.jar")):  # what the JVM checks of each: its size and time
        key.update(f"{jar.name} {jar.stat().st_size} {jar.stat().st_mtime_ns}\n".encode())
    key.update(JAVA_OPTIONS.encode())
    return FOLDER / f"spark-{key.hexdigest()[:16]}.jsa"


def _properties(path: Path, driver: str, executor: str) -> Path:
    text = f"spark.driver.defaultJavaOptions   {driver}\nspark.executor.defaultJavaOptions {executor}\n"
    if not path.is_file() or path.read_text() != text:  # JVMs of the suite may be reading it
        path.write_text(text)
    return path


def _make(archive: Path) -> None:
    """Runs the job with ``-XX:ArchiveClassesAtExit`` on its driver: the archive, if it could be
    made (the suite runs without it otherwise, and says so)."""
    with tempfile.TemporaryDirectory(prefix="hvd-cds-") as scratch:
        dumped = Path(scratch, "spark.jsa")
        driver = f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={dumped}"
        properties = _properties(Path(scratch, "spark-defaults.conf"), driver, JAVA_OPTIONS)
        env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
        env |= {"PYSPARK_SUBMIT_ARGS": f"--properties-file {properties} pyspark-shell"}
        env |= {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        try:
            done = subprocess.run(
                [sys.executable, "-c", JOB], env=env, cwd=scratch, capture_output=True, text=True,
                timeout=MAKE_SECONDS, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            done = None
        if done is None or done.returncode != 0 or not dumped.is_file():
            said = "" if done is None else (done.stdout + done.stderr)[-2000:]
            print(f"tests/spark_jvm.py: no class archive made, Spark starts without\n{said}", file=sys.stderr)
            return
        shutil.move(dumped, archive.with_suffix(".part"))
        os.replace(archive.with_suffix(".part"), archive)


def _keep(archive: Path) -> None:
    """The archive just made, kept for the next fresh environments (as the bytecode is: the
    newest few kept)."""
    if archive.is_file():
        link(archive, KEPT / archive.name)
        prune(KEPT, "*.jsa")


def environment() -> dict[str, str]:
    """The variables every Spark JVM of the suite is started under (made once, under a lock,
    by the first process of the suite that asks)."""
    FOLDER.mkdir(exist_ok=True)
    archive = archive_path()
    with open(FOLDER / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker of the suite may be making it
        if not archive.is_file() and not link(KEPT / archive.name, archive):
            _make(archive)
            _keep(archive)
        shared = f"-XX:SharedArchiveFile={archive} {QUIET}" if archive.is_file() else ""
        options = f"{JAVA_OPTIONS} {shared}".strip()
        properties = _properties(archive.with_suffix(".conf"), options, options)
    return {
        "PYSPARK_SUBMIT_ARGS": f"--properties-file {properties} pyspark-shell",
        "SPARK_DAEMON_JAVA_OPTS": options,  # the standalone masters and workers
    }


if __name__ == "__main__":  # `make test` makes it beside its other steps, before pytest starts
    environment()
    made = archive_path()
    print(f"Spark class archive: {made}" if made.is_file() else "Spark class archive: none (see above)")
