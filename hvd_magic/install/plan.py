"""What ``install-horovod`` will do in this environment: the build's switches, its cache entry, and
what is missing first. Pure: it works from a detected ``Toolchain``, so it can be tested anywhere."""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from hvd_magic.errors import InstallError
from hvd_magic.install.detect import Toolchain, distribution_version

__all__ = ["CACHE_PREFIX", "HOROVOD_VERSION", "BuildPlan", "cached_wheel", "make_plan", "python_build_tools"]

HOROVOD_VERSION = "0.28.1"
# What edits.patch_source changes, by revision: a wheel cached before the last change is built anew
# (2: idle ranks in phase; 3: PyTorch's waits and the timeline's writer sleep). Part of the cache
# entry's name, not of its key.
SOURCE_EDITS = 3
CACHE_PREFIX = f"horovod-{HOROVOD_VERSION}-edits{SOURCE_EDITS}-"
# The Python tools Horovod's setup.py builds with (it is built without build isolation, against
# the installed frameworks); the bounds are the ones this build is tested with.
BUILD_TOOLS = {"setuptools": "setuptools<80", "wheel": "wheel", "packaging": "packaging", "pyyaml": "pyyaml"}
CMAKE_RANGE = ((3, 13), (4, 0))  # Horovod's third-party CMake files do not configure with CMake 4
KEY = re.compile(r"^py(?P<py>\d+)-torch(?P<torch>.+?)-tf(?P<tf>.+?)-ompi(?P<mpi>[^-]+)(?P<gpu>-cu.+)?$")


@dataclass(frozen=True)
class BuildPlan:
    toolchain: Toolchain
    cache: Path
    with_mpi: bool
    pip_first: tuple[str, ...]  # Python build tools pip installs before the build

    @property
    def key(self) -> str:
        t = self.toolchain
        mpi = t.mpirun if self.with_mpi and t.mpirun else "none"
        gpu = f"-cu{t.torch_cuda}" if t.gpu else ""
        return f"{t.python_tag}-torch{t.torch or 'none'}-tf{t.tensorflow or 'none'}-ompi{mpi}{gpu}"

    @property
    def directory(self) -> Path:
        return self.cache / f"{CACHE_PREFIX}{self.key}"

    def build_env(self) -> dict[str, str]:
        """Horovod's own build switches: what is installed is built, the rest explicitly left out."""
        t = self.toolchain

        def switch(name: str, on: bool) -> tuple[str, str]:
            return (f"HOROVOD_WITH_{name}" if on else f"HOROVOD_WITHOUT_{name}", "1")

        env = dict(
            [
                switch("PYTORCH", t.torch is not None),
                switch("TENSORFLOW", t.tensorflow is not None),
                switch("MPI", self.with_mpi),
                switch("GLOO", True),
                switch("MXNET", False),
            ]
        )
        if t.gpu and t.nccl is not None:
            env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
            if t.nccl.lib is not None:  # pip's NCCL: the shared library torch loads (build links a home)
                env["HOROVOD_NCCL_LINK"] = "SHARED"
            if t.cuda_home is not None:  # Horovod's CMake and torch's extension find CUDA here
                env["HOROVOD_CUDA_HOME"] = env["CUDA_HOME"] = t.cuda_home
        return env

    def describe(self, wheel: Path | None) -> str:
        t = self.toolchain
        rows = [
            ("PyTorch", f"{t.torch}: its ops are built" if t.torch else "not installed: left out"),
            (
                "TensorFlow",
                f"{t.tensorflow}: its ops are built" if t.tensorflow else "not installed: left out",
            ),
            ("MPI", f"Open MPI {t.mpirun}: built in" if self.with_mpi else "left out (--without-mpi)"),
            ("Gloo", "built in (launcher=gloo)"),
            (
                "GPU operations",
                f"NCCL (torch CUDA {t.torch_cuda}; {t.nccl.include})"
                if t.nccl and t.gpu
                else "none: CPU only",
            ),  # fmt: skip
            ("compiler", f"{t.compiler.name} {t.compiler.version}"),
            ("cache", str(self.directory)),
            ("wheel", f"cached: {wheel.name}" if wheel else "to build (about 5 minutes on 2 cores)"),
        ]
        if self.pip_first:
            rows.append(("pip first", " ".join(self.pip_first)))
        width = max(len(name) for name, _ in rows)
        lines = [f"Horovod {HOROVOD_VERSION} for Python {t.python}:"]
        lines += [f"  {name:<{width}}  {value}" for name, value in rows]
        if wheel is None:
            lines.append(
                "  changes for today's frameworks: C++17; TensorFlow >= 2.19 without xla_mpi_ops.cc;"
            )
            lines.append("  the Keras binding uses tf.keras.backend; waits that sleep instead of spinning:")
            lines.append("  idle MPI ranks, PyTorch's synchronize(), the timeline's writer")
        return "\n".join(lines)


def _cmake_usable(version: str | None) -> bool:
    if version is None:
        return False
    parts = tuple(int(p) for p in version.split(".")[:2])
    return CMAKE_RANGE[0] <= parts < CMAKE_RANGE[1]


def python_build_tools(cmake_version: str | None) -> tuple[str, ...]:
    """The pip requirements missing for the build (or at a version it does not build with)."""
    missing = [spec for name, spec in BUILD_TOOLS.items() if distribution_version(name) is None]
    setuptools = distribution_version("setuptools")
    if setuptools is not None and int(setuptools.split(".")[0]) >= 80:
        missing.append(BUILD_TOOLS["setuptools"])
    if not _cmake_usable(cmake_version):
        missing.append("cmake>=3.13,<4")
    return tuple(missing)


def system_fix(packages: dict[str, str]) -> str:
    """The one command that installs ``packages`` ({Debian name: what it is}) on this system."""
    names = " ".join(packages)
    if Path("/etc/debian_version").exists():
        return f"sudo apt-get install -y {names}"
    if Path("/etc/redhat-release").exists():
        names = names.replace("g++", "gcc-c++").replace("libopenmpi-dev", "openmpi-devel")
        return f"sudo dnf install -y {names.replace('openmpi-bin', 'openmpi')}"
    return f"install {', '.join(packages.values())} with your system's package manager"


def make_plan(toolchain: Toolchain, cache: Path, with_mpi: bool = True) -> BuildPlan:
    """The plan, or ``InstallError`` naming everything missing and the one command that adds it."""
    if toolchain.torch is None and toolchain.tensorflow is None:
        raise InstallError(
            "neither PyTorch nor TensorFlow is installed in this environment: Horovod builds its "
            "operations against the framework it finds. Install yours first (e.g. `pip install torch`), "
            "then run `python -m hvd_magic install-horovod` again."
        )
    if toolchain.torch_problem:
        raise InstallError(
            f"torch {toolchain.torch} is installed but does not import ({toolchain.torch_problem}); "
            "Horovod would be built against it. Repair torch first (e.g. `pip install --force-reinstall "
            f"torch=={toolchain.torch}`), then run `python -m hvd_magic install-horovod` again."
        )
    missing: dict[str, str] = {}
    if not toolchain.compiler.present:
        missing["g++"] = "a C++17 compiler"
    if with_mpi and not (toolchain.mpirun and toolchain.mpi_headers):
        missing["openmpi-bin"] = "Open MPI"
        missing["libopenmpi-dev"] = "its headers"
    if missing:
        raise InstallError(
            f"building Horovod needs {', '.join(missing.values())}, which this machine lacks. "
            f"Run:\n    {system_fix(missing)}\nthen run `python -m hvd_magic install-horovod` again"
            + (" (or add --without-mpi to build with Gloo only)." if "openmpi-bin" in missing else ".")
        )
    return BuildPlan(toolchain, cache, with_mpi, python_build_tools(toolchain.cmake.version))


def _serves(key: str, plan: BuildPlan) -> bool:
    """A cached wheel serves this environment if it was built for the same Python, MPI and GPU
    setup, and against the same version of every framework installed here (a wheel that also
    has another framework's ops serves an environment without that framework)."""
    mine, theirs = KEY.match(plan.key), KEY.match(key)
    if mine is None or theirs is None:
        return False
    if any(mine[part] != theirs[part] for part in ("py", "mpi", "gpu")):
        return False
    return all(mine[f] == "none" or mine[f] == theirs[f] for f in ("torch", "tf"))


def cached_wheel(plan: BuildPlan) -> Path | None:
    """A wheel in the cache that serves ``plan``: its own entry first, then any compatible one;
    only wheels for this machine's platform (a cache may be shared between machines)."""
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")  # e.g. linux_x86_64
    entries = [plan.directory] + sorted(p for p in plan.cache.glob(CACHE_PREFIX + "*") if p != plan.directory)
    for entry in entries:
        if entry.is_dir() and _serves(entry.name.removeprefix(CACHE_PREFIX), plan):
            wheels = sorted(entry.glob(f"horovod-*-{platform}.whl"))
            if wheels:
                return wheels[0]
    return None
