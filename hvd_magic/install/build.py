"""Builds Horovod's wheel from its PyPI sdist for this environment, caches it, and installs it.

The sdist is changed first (``edits``: what today's frameworks need, and waits that sleep).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from hvd_magic.errors import InstallError
from hvd_magic.install.detect import find_cmake
from hvd_magic.install.edits import patch_source
from hvd_magic.install.plan import HOROVOD_VERSION, BuildPlan, cached_wheel

__all__ = ["install"]

Say = Callable[[str], None]
# Horovod's headers use std::string, std::logic_error and fixed-width integers without including
# their headers; GCC >= 13's standard library no longer brings them in by the way.
FORCED_INCLUDES = "-include cstdint -include string -include stdexcept"


def _pip(*args: str, log: Path | None = None, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, "-m", "pip", *args]
    if log is None:
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        output = done.stdout + done.stderr
    else:
        with log.open("w") as out:
            done = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, check=False
            )
        output = log.read_text()
    if done.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-25:])
        where = f" (the whole log: {log})" if log else ""
        raise InstallError(f"`pip {' '.join(args[:2])} ...` failed{where}:\n{tail}")


def _source(work: Path, sdist: Path | None) -> Path:
    if sdist is None:
        _pip(
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"horovod=={HOROVOD_VERSION}",
            "-d",
            str(work),
        )
        sdist = work / f"horovod-{HOROVOD_VERSION}.tar.gz"
    try:
        with tarfile.open(sdist) as archive:
            _unpack(archive, work)
    except (tarfile.TarError, OSError) as err:
        raise InstallError(f"Horovod's source archive {sdist} does not unpack: {err}") from None
    source = work / f"horovod-{HOROVOD_VERSION}"
    if not source.is_dir():
        raise InstallError(f"{sdist} holds no horovod-{HOROVOD_VERSION}/ folder: not Horovod's sdist")
    return source


def _unpack(archive: tarfile.TarFile, work: Path) -> None:
    """Unpacks with tarfile's data filter, or, on Python versions older than it (3.11.3 and
    before), refuses members that are links or would land outside ``work``."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(work, filter="data")
        return
    root = work.resolve()
    for member in archive.getmembers():
        if member.issym() or member.islnk() or not (root / member.name).resolve().is_relative_to(root):
            raise tarfile.TarError(f"unsafe member {member.name!r}")
    archive.extractall(work)


def build_wheel(plan: BuildPlan, say: Say, sdist: Path | None = None) -> Path:
    """Builds into the plan's cache entry and returns the wheel (the build log stays beside it)."""
    if plan.pip_first:
        say(f"installing the build's Python tools: {' '.join(plan.pip_first)}")
        _pip("install", "-q", *plan.pip_first)
    plan.directory.mkdir(parents=True, exist_ok=True)
    log = plan.directory / "build.log"
    with tempfile.TemporaryDirectory(prefix="hvd_magic-horovod-") as tmp:
        work = Path(tmp)
        source = _source(work, sdist)
        patch_source(source, plan.toolchain.tensorflow is not None)
        say(f"building Horovod {HOROVOD_VERSION} (about 5 minutes on 2 cores; log: {log})")
        env = {**os.environ, **plan.build_env(), "MAKEFLAGS": f"-j{os.cpu_count() or 1}"}
        env["CXXFLAGS"] = f"{FORCED_INCLUDES} {env.get('CXXFLAGS', '')}".strip()
        _link_nccl(plan, env, work)
        if "CUDA_HOME" in env:  # its nvcc first, not a wrapper of it elsewhere on the PATH
            env["PATH"] = f"{env['CUDA_HOME']}/bin{os.pathsep}{env.get('PATH', '')}"
        cmake = find_cmake()  # after pip_first: the cmake it installed, beside this Python
        if cmake.present:
            env["HOROVOD_CMAKE"] = cmake.name  # Horovod's setup.py runs this one, not the PATH's
        _pip(
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            str(source),
            "-w",
            str(work / "out"),
            log=log,
            env=env,
        )
        built = next((work / "out").glob("horovod-*.whl"), None)
        if built is None:
            raise InstallError(f"the build ended without a Horovod wheel; see its log: {log}")
        wheel = plan.directory / built.name
        partial = wheel.with_name(wheel.name + ".partial")  # the cache sees only whole wheels
        shutil.move(str(built), partial)
        os.replace(partial, wheel)
    return wheel


def _link_nccl(plan: BuildPlan, env: dict[str, str], work: Path) -> None:
    """pip's NCCL has only ``libnccl.so.2`` where CMake looks for ``libnccl.so``: a home for
    Horovod's build, of links to the wheel's files (the wheel itself is left as it is)."""
    nccl = plan.toolchain.nccl
    if nccl is None or nccl.lib is None or not plan.toolchain.gpu:
        return
    versioned = sorted(Path(nccl.lib).glob("libnccl.so*"))
    if not versioned:
        raise InstallError(f"{nccl.lib} holds no libnccl.so*: NCCL's library is not where its wheel puts it")
    home = work / "nccl"
    (home / "lib").mkdir(parents=True)
    (home / "include").symlink_to(nccl.include)
    (home / "lib" / "libnccl.so").symlink_to(versioned[0])
    env["HOROVOD_NCCL_HOME"] = str(home)
    for name in ("NCCL_ROOT", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB"):  # searched before the home
        env.pop(name, None)


def _check_import(plan: BuildPlan) -> None:
    probes = []
    if plan.toolchain.torch:
        probes.append("import horovod.torch")
    if plan.toolchain.tensorflow:
        probes.append("import horovod.tensorflow")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", "; ".join(probes)], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-10:])
        raise InstallError(
            f"Horovod was installed but does not import:\n{tail}\n"
            "Run again with --rebuild to build it anew for this environment."
        )


def install(plan: BuildPlan, say: Say, rebuild: bool = False, sdist: Path | None = None) -> Path:
    """Installs a cached wheel that serves ``plan`` (building one first if there is none)."""
    wheel = None if rebuild else cached_wheel(plan)
    if wheel is None:
        wheel = build_wheel(plan, say, sdist)
    else:
        say(f"using the cached wheel {wheel}")
    try:
        _pip("install", "-q", "--no-deps", "--force-reinstall", str(wheel))
    except InstallError as err:
        raise InstallError(f"{err}\nIf the cached wheel is damaged, run again with --rebuild.") from None
    # Horovod's own run-time requirements; pip resolves only what is missing.
    _pip("install", "-q", "cloudpickle", "psutil", "pyyaml", "packaging")
    _check_import(plan)
    say(f"installed {wheel.name}")
    return wheel
