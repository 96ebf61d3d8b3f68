"""What a Horovod build in this Python environment would be built against, found without building.

Frameworks come from the installed distributions (torch is imported once, for its CUDA version);
the toolchain from the PATH. Nothing here changes the environment.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Found", "Nccl", "Toolchain", "detect", "distribution_version", "find_cmake", "mpirun_version"]

TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel")
NCCL_HEADER_DIRS = ("/usr/include", "/usr/local/cuda/include", "/usr/local/include")


@dataclass(frozen=True)
class Found:
    """One tool: its version when found, else None."""

    name: str
    version: str | None

    @property
    def present(self) -> bool:
        return self.version is not None


@dataclass(frozen=True)
class Nccl:
    """Where NCCL is: its header's folder, and its library's folder when the compiler would not
    look there (pip's ``nvidia-nccl-cu*`` wheels: ``site-packages/nvidia/nccl/{include,lib}``)."""

    include: str
    lib: str | None = None


@dataclass(frozen=True)
class Toolchain:
    python: str  # "3.11"
    torch: str | None  # "2.13.0+cpu"
    torch_cuda: str | None  # "12.4" for a CUDA build of torch, else None
    torch_problem: str  # why an installed torch does not import ("" when it does)
    tensorflow: str | None
    mpirun: str | None  # Open MPI's version, e.g. "4.1.4"
    mpi_headers: bool
    compiler: Found
    cmake: Found
    nccl: Nccl | None
    cuda_home: str | None = None  # the CUDA toolkit's folder (for a CUDA torch, when there is one)

    @property
    def python_tag(self) -> str:
        return "py" + self.python.replace(".", "")

    @property
    def gpu(self) -> bool:
        return self.torch_cuda is not None and self.nccl is not None


def distribution_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _first_line(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout or done.stderr).strip().split("\n")[0]


def _version_in(text: str) -> str | None:
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def mpirun_version() -> str | None:
    """Open MPI's (or another MPI's) version as ``mpirun --version`` tells it; None without mpirun."""
    if shutil.which("mpirun") is None:
        return None
    return _version_in(_first_line(["mpirun", "--version"])) or "unknown"


def _torch_cuda() -> tuple[str | None, str]:
    """torch's CUDA version (None for a CPU build), and why torch does not import, if it does not."""
    if distribution_version("torch") is None:
        return None, ""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - reported by the plan, with what to do
        return None, f"{type(err).__name__}: {err}"
    return getattr(torch.version, "cuda", None), ""


def _mpi_headers() -> bool:
    wrapper = shutil.which("mpicxx") or shutil.which("mpic++")
    if wrapper is None:
        return False
    for flag in ("--showme:compile", "-show"):  # Open MPI's wrapper, MPICH's
        try:
            done = subprocess.run([wrapper, flag], capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if done.returncode == 0:
            return True
    return False


def _compiler() -> Found:
    for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return Found(name, _version_in(_first_line([name, "--version"])) or "unknown")
    return Found("g++", None)


def find_cmake() -> Found:
    """The cmake the build would run: the environment's own (pip's cmake) first, then the PATH's."""
    beside = Path(sys.executable).parent / "cmake"
    for path in (str(beside) if beside.exists() else None, shutil.which("cmake")):
        if path:
            return Found(path, _version_in(_first_line([path, "--version"])))
    return Found("cmake", None)


def _nccl() -> Nccl | None:
    """NCCL as a user's machine has it: ``$HOROVOD_NCCL_HOME``; else the ``nvidia-nccl-cu*`` wheel
    that CUDA PyTorch brings (the copy torch itself loads, so preferred); else the system's."""
    home = os.environ.get("HOROVOD_NCCL_HOME") or os.environ.get("NCCL_HOME")
    if home:
        return Nccl(f"{home}/include", f"{home}/lib") if Path(home, "include", "nccl.h").exists() else None
    for site_packages in sorted({*site.getsitepackages(), sysconfig.get_path("purelib")}):
        wheel = Path(site_packages, "nvidia", "nccl")
        if (wheel / "include" / "nccl.h").exists() and any((wheel / "lib").glob("libnccl.so*")):
            return Nccl(str(wheel / "include"), str(wheel / "lib"))
    for folder in NCCL_HEADER_DIRS:
        if Path(folder, "nccl.h").exists():
            return Nccl(folder)
    return None


def _cuda_home() -> str | None:
    """The CUDA toolkit's real folder (with ``bin/nvcc`` and ``include/cuda_runtime.h``), also where
    the PATH's ``nvcc`` is a wrapper script elsewhere (CMake and torch would take its folder)."""
    candidates = [os.environ[v] for v in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        top = re.search(r"^#\$ TOP=(.+)$", _dry_run(nvcc), re.MULTILINE)  # nvcc's own idea of its root
        candidates += [str(Path(top.group(1).strip()).resolve())] if top else []
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates.append("/usr/local/cuda")
    for home in candidates:
        if Path(home, "bin", "nvcc").is_file() and Path(home, "include", "cuda_runtime.h").is_file():
            return str(Path(home).resolve())
    return None


def _dry_run(nvcc: str) -> str:
    command = [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def detect() -> Toolchain:
    torch_cuda, torch_problem = _torch_cuda()
    return Toolchain(
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        torch=distribution_version("torch"),
        torch_cuda=torch_cuda,
        torch_problem=torch_problem,
        tensorflow=distribution_version(*TENSORFLOW_DISTRIBUTIONS),
        mpirun=mpirun_version(),
        mpi_headers=_mpi_headers(),
        compiler=_compiler(),
        cmake=find_cmake(),
        nccl=_nccl() if torch_cuda is not None else None,
        cuda_home=_cuda_home() if torch_cuda is not None else None,
    )
