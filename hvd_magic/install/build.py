"""Builds Horovod's wheel from its PyPI sdist for this environment, caches it, and installs it.

Horovod 0.28.1 predates PyTorch >= 2.1 (whose headers need C++17), TensorFlow >= 2.19 (whose XLA
op API changed) and Keras 3 (its Keras binding imports the Keras 3 backend); ``patch_source``
makes those changes, keeps idle MPI ranks from spinning, and fails loudly if the source no longer
looks as expected.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from hvd_magic.errors import InstallError
from hvd_magic.install.detect import find_cmake
from hvd_magic.install.plan import HOROVOD_VERSION, BuildPlan, cached_wheel

__all__ = ["install", "patch_source"]

Say = Callable[[str], None]
# Horovod's headers use std::string, std::logic_error and fixed-width integers without including
# their headers; GCC >= 13's standard library no longer brings them in by the way.
FORCED_INCLUDES = "-include cstdint -include string -include stdexcept"
KERAS_IMPORT = re.compile(r"^(\s*)from keras import backend as K$", re.MULTILINE)
# Horovod's background thread starts a cycle HOROVOD_CYCLE_TIME (5 ms) after the last one started
# and negotiates in it with every rank: over MPI a collective that busy-waits for the last rank to
# come. Ranks whose cycles are out of phase keep their offset for good, and an idle rank spins a
# core for it (seen here: 8.0 CPU-s in an 8 s sleep after hvd.init(), the other rank 0.16; Horovod
# issue #2804). After a cycle with nothing to do, the next counts from the negotiation's end,
# the same moment on every rank: idle ranks fall in phase and sleep (0.27 CPU-s each). Busy
# cycles keep their pace; Gloo, which waits without spinning, keeps its own (in phase, its idle
# ranks took more: 1.0-2.0 CPU-s against 0.6).
NEGOTIATED = """    if (process_set_id == 0) {
      state.mark_cycles_in_timeline =
          state.timeline_controller.MarkCyclesInTimelinePending();
    }
"""
IN_PHASE = """    if (process_set_id == 0 && state.control_operation == LibType::MPI &&
        response_list.responses().empty()) {
      state.last_cycle_start = std::chrono::steady_clock::now();  // hvd_magic: idle ranks in phase
    }
"""


def _edit(path: Path, old: str | re.Pattern[str], new: str) -> None:
    text = path.read_text()
    changed = old.sub(new, text) if isinstance(old, re.Pattern) else text.replace(old, new)
    if changed == text:
        raise InstallError(
            f"Horovod's source changed: {path.name} no longer has {getattr(old, 'pattern', old)!r}"
        )
    path.write_text(changed)


def patch_source(source: Path, with_tensorflow: bool) -> None:
    """The changes today's frameworks need, applied to an unpacked Horovod source tree."""
    for cmake in (source / "CMakeLists.txt", source / "horovod" / "torch" / "CMakeLists.txt"):
        _edit(cmake, "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)")
    # CUDA 13's headers need C++17 too; and the driver's library is libcuda.so.1 on a machine
    # without CUDA's development files (the unversioned name comes with them).
    cuda_kernels = source / "horovod" / "common" / "ops" / "cuda" / "CMakeLists.txt"
    _edit(cuda_kernels, "set(CMAKE_CUDA_STANDARD 11)", "set(CMAKE_CUDA_STANDARD 17)")
    _edit(source / "horovod" / "torch" / "cuda_util.cc", 'dlopen("libcuda.so",', 'dlopen("libcuda.so.1",')
    if with_tensorflow:
        tf_cmake = source / "horovod" / "tensorflow" / "CMakeLists.txt"
        lines = tf_cmake.read_text().splitlines(keepends=True)
        kept = [line for line in lines if "xla_mpi_ops.cc" not in line]
        if len(kept) == len(lines):
            raise InstallError(f"Horovod's source changed: {tf_cmake} no longer lists xla_mpi_ops.cc")
        tf_cmake.write_text("".join(kept))
    keras = source / "horovod" / "tensorflow" / "keras"
    for module in (keras / "__init__.py", keras / "callbacks.py"):
        _edit(module, KERAS_IMPORT, r"\1K = tf.keras.backend")
    _edit(source / "horovod" / "common" / "operations.cc", NEGOTIATED, NEGOTIATED + IN_PHASE)


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
