"""The doctor's checks of this machine: mpirun, Horovod and the frameworks it was built for, and
hvd_magic's own compiled parts. Each check says what it found and, when it fails, the fix."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hvd_magic.install.detect import TENSORFLOW_DISTRIBUTIONS, distribution_version, mpirun_version
from hvd_magic.install.plan import system_fix

__all__ = ["Check", "local_checks"]

CONTROLLERS = {"mpi": "MPI", "gloo": "Gloo", "nccl": "NCCL"}
REBUILD = "python -m hvd_magic install-horovod --rebuild"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: nothing wrong, nothing to check (e.g. no Spark session)
    detail: str
    fix: str = ""

    @property
    def mark(self) -> str:
        return {True: "✓", False: "✗", None: "–"}[self.ok]


def mpirun_check() -> Check:
    version = mpirun_version()
    if version is None:
        fix = f"{system_fix({'openmpi-bin': 'Open MPI'})}, or run with launcher=gloo"
        return Check("mpirun", False, "not found on PATH", fix)
    return Check("mpirun", True, f"Open MPI {version}")


def _binding(framework: str) -> dict[str, object]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "hvd_magic.doctor.probe", framework]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return {"imports": False, "problem": "the import did not finish in 120 s"}
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        if isinstance(found, dict):
            return found
    except (IndexError, ValueError):
        pass
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"imports": False, "problem": f"the import crashed the process: {tail}"}


def _binding_check(framework: str, version: str, found: dict[str, object]) -> Check:
    name = f"horovod.{framework}"
    if not found["imports"]:
        return Check(name, False, f"does not import with {framework} {version}: {found['problem']}", REBUILD)
    built = ", ".join(f"{label} {'✓' if found[c] else '✗'}" for c, label in CONTROLLERS.items())
    if not found["mpi"] and mpirun_version() is not None:
        detail = f"{framework} {version}; built with {built}: without MPI although mpirun is here"
        return Check(name, False, detail, f"use launcher=gloo, or {REBUILD}")
    return Check(name, True, f"{framework} {version}; built with {built}")


def horovod_checks() -> list[Check]:
    horovod = distribution_version("horovod")
    if horovod is None:
        return [Check("Horovod", False, "not installed", "python -m hvd_magic install-horovod")]
    frameworks = {
        "torch": distribution_version("torch"),
        "tensorflow": distribution_version(*TENSORFLOW_DISTRIBUTIONS),
    }
    installed = {name: version for name, version in frameworks.items() if version}
    checks = [Check("Horovod", True, f"{horovod}")]
    if not installed:
        return [
            *checks,
            Check("frameworks", False, "neither torch nor TensorFlow is installed", "pip install torch"),
        ]
    with ThreadPoolExecutor(len(installed)) as pool:  # TensorFlow's import alone takes seconds
        probes: dict[str, Future[dict[str, object]]] = {n: pool.submit(_binding, n) for n in installed}
        return checks + [_binding_check(n, installed[n], probes[n].result()) for n in installed]


def hvd_magic_check() -> Check:
    package = Path(__file__).parent.parent
    version = distribution_version("hvd_magic") or "source tree"
    missing = []
    try:  # the compiled timeline scanner and span matcher
        for part in ("_scan", "_match"):
            importlib.import_module(f"{__name__.rsplit('.', 2)[0]}.timeline.{part}")
    except ImportError:
        missing.append("the compiled timeline scanner (the pure-Arrow reader is used: slower)")
    if not (package / "static" / "viewer.js").exists():
        missing.append("the timeline viewer's bundle (hvd_magic/static/viewer.js)")
    if missing:  # optional parts: runs work without them
        fix = "reinstall hvd_magic from a wheel, or build it where a C compiler and npm are present"
        return Check("hvd_magic", None, f"{version}; missing {' and '.join(missing)}", fix)
    return Check("hvd_magic", True, f"{version} (Python {sys.version.split()[0]})")


def local_checks() -> list[Check]:
    return [hvd_magic_check(), mpirun_check(), *horovod_checks()]
