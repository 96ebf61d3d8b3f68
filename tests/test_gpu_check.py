"""scripts/gpu_check.sh, the GPU machine's check, kept from rotting where there is no GPU: its plan,
what it carries, and every check's cells run on the CPU (Gloo where the GPU has NCCL, the CPU
where it has CUDA) through the same %%horovod, sessions, retries and straggler watch."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import tomllib

from .helpers import SUITE_VARIABLE

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts" / "gpu_check"))
import carry  # noqa: E402 - the script's own module, beside it
import checks  # noqa: E402


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # a bare environment, as on the GPU machine; the suite's mark, so that its ranks are known as
    # this test's, not taken for leftovers by a test running beside it (helpers.run_processes_anywhere)
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    env[SUITE_VARIABLE] = os.environ[SUITE_VARIABLE]
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_the_plan_names_what_it_carries_builds_and_runs(tmp_path):
    done = run("--plan", "--carry", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "install-horovod --without-mpi" in done.stdout
    for name in checks.CHECKS:
        assert (f"  {name} " in done.stdout) == (name not in checks.APART)
    assert "ipython==9.18.1" in done.stdout and "missing: run `--fetch`" in done.stdout
    assert "horovod-0.28.1.tar.gz" in done.stdout


def test_what_it_carries_is_what_hvd_magic_needs_at_the_suites_versions():
    """Each of hvd_magic's requirements is carried or is in a CUDA PyTorch image; each carried
    wheel is the version this suite runs with (a bumped pin here moves the GPU check too)."""
    needs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {need.split(">")[0].split("=")[0].strip().lower() for need in needs}
    carried = {spec.split("==")[0] for spec in carry.WHEELS}
    assert names <= carried | set(carry.IMAGE_HAS), names - carried - set(carry.IMAGE_HAS)
    for spec in carry.WHEELS:
        name, version = spec.split("==")
        assert importlib.metadata.version(name) == version, spec


def test_the_trainers_check_carries_what_transformers_and_accelerate_need():
    """The HF Trainer check's group is exactly what transformers and accelerate require, at any
    depth, beyond the image: a new requirement of theirs fails here, not on the GPU machine."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    needed, todo = set(), ["transformers", "accelerate"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in needed or name in carry.IMAGE_HAS:
            continue
        needed.add(name)
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    assert {spec.split("==")[0] for spec in carry.GROUPS["trainers"]} == needed


def test_the_trainers_check_travels_apart(tmp_path):
    """Alone, its plan names only what it needs (no build); beside the rest, the plan says it runs apart."""
    alone = run("--plan", "--carry", str(tmp_path), "--only", "hf_trainer")
    assert alone.returncode == 0, alone.stderr
    assert "transformers==5.25.0" in alone.stdout and "cmake==" not in alone.stdout
    assert "install-horovod" not in alone.stdout and "  hf_trainer " in alone.stdout
    together = run("--plan", "--carry", str(tmp_path))
    assert "  hf_trainer " not in together.stdout and "transformers" not in together.stdout
    assert "--only hf_trainer" in together.stdout


def test_every_check_passes_its_cpu_dry_run(tmp_path):
    done = run("--cpu", "--out", str(tmp_path))
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in lines if line.startswith(("PASS", "FAIL"))] == [
        f"PASS {name}" for name in checks.CHECKS
    ]
    assert f"{len(checks.CHECKS)} passed, 0 failed" in lines[-1]
    assert [path.name for path in tmp_path.iterdir()] == ["checks.log"]  # one file: the device brings back 8
    logged = (tmp_path / "checks.log").read_text()
    assert all(f"===== {name}\n" in logged for name in checks.CHECKS)
