"""What a bare GPU machine lacks and the check carries to it: wheels for its Python, and Horovod's
source. Fetched here (``--fetch``, where PyPI is reachable) into a git-ignored folder that travels
with the checkout; installed there from that folder alone (pip with no index)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HOROVOD_SDIST = "horovod-0.28.1.tar.gz"
LIMIT_BYTES = 60 * 2**20  # what may travel, all of it

# What a CUDA PyTorch image has (the device tool's image lists them) and the checks use as it is.
IMAGE_HAS = ("torch", "numpy", "psutil", "cloudpickle", "pyarrow", "pandas", "tensorboard", "nvidia-ml-py",
             "pyyaml", "packaging", "pygments", "typing-extensions")  # fmt: skip
# hvd_magic's own needs that such an image lacks: IPython and what it imports, and pyzmq.
CARRIED = ("ipython", "ipython-pygments-lexers", "traitlets", "jedi", "parso", "prompt-toolkit", "wcwidth",
           "pexpect", "ptyprocess", "decorator", "matplotlib-inline", "stack-data", "asttokens", "executing",
           "pure-eval", "pyzmq")  # fmt: skip
# The two build tools install-horovod asks for at versions Horovod 0.28.1 builds with (the image's
# setuptools 81 and cmake 4.4 are outside them).
BUILD_TOOLS = ("setuptools", "cmake")
# The HF Trainer check's: transformers, accelerate and what they need beyond the image (30 MB).
TRAINERS = ("transformers", "accelerate", "huggingface-hub", "tokenizers", "safetensors", "regex", "tqdm",
            "filelock", "fsspec", "hf-xet", "httpx2", "httpcore2", "h11", "anyio", "idna", "truststore",
            "click", "typer", "annotated-doc", "rich", "markdown-it-py", "mdurl", "shellingham", "kernels",
            "tomlkit", "pydantic", "pydantic-core", "typing-inspection", "annotated-types")  # fmt: skip
PINS = Path(__file__).resolve().parents[2] / "requirements-dev.txt"


def pinned(names: tuple[str, ...], pins: Path = PINS) -> tuple[str, ...]:
    """``name==version`` for each of ``names``, as ``pins`` (a requirements file) pins it."""
    from packaging.requirements import Requirement

    found = {}
    for line in pins.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec and not spec.startswith("-"):
            requirement = Requirement(spec)
            exact = [item.version for item in requirement.specifier if item.operator == "=="]
            if exact:
                found[requirement.name.lower()] = exact[0]
    unpinned = [name for name in names if name not in found]
    if unpinned:
        raise SystemExit(f"{pins} pins no version of {', '.join(unpinned)}: pin it with ==")
    return tuple(f"{name}=={found[name]}" for name in names)


# What travels, in groups a check needs (``checks.NEEDS``): the wheels at the versions the suite
# runs with, as requirements-dev.txt pins them (``WHEELS``), and for the build, Horovod's sdist and
# cffi, which its setup.py asks setuptools for (setup_requires) and gets from the carried folder
# too (any version serves; these ran the build on an H200).
PINNED = {"ipython": pinned(CARRIED), "build": pinned(BUILD_TOOLS), "trainers": pinned(TRAINERS)}
WHEELS = tuple(spec for specs in PINNED.values() for spec in specs)
GROUPS = PINNED | {"build": PINNED["build"] + ("cffi==2.0.0", "pycparser==2.23")}
# What the checks import from each group's wheels; the rest of a group is what these need.
ENTRY_POINTS = {"ipython": ("ipython", "pyzmq"), "trainers": ("transformers", "accelerate")}
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


@dataclass(frozen=True)
class Carried:
    folder: Path
    groups: tuple[str, ...] = tuple(GROUPS)  # what the chosen checks need

    @property
    def specs(self) -> tuple[str, ...]:
        return tuple(spec for group in self.groups for spec in GROUPS[group])

    @property
    def wheels(self) -> list[Path]:
        return sorted(self.folder.glob("*.whl"))

    @property
    def sdist(self) -> Path:
        return self.folder / HOROVOD_SDIST

    def size(self) -> int:
        return sum(path.stat().st_size for path in self.folder.glob("*") if path.is_file())

    def missing(self) -> list[str]:
        """The requirements with no wheel in the folder yet (and the sdist, if absent)."""
        have = {_project(path.name) for path in self.wheels}
        gone = [spec for spec in self.specs if _project(spec.split("==")[0]) not in have]
        return gone + ([HOROVOD_SDIST] if "build" in self.groups and not self.sdist.exists() else [])

    def pip_env(self) -> dict[str, str]:
        """pip reads these: every install resolves from the carried folder, never an index."""
        return {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(self.folder.resolve())}


def _project(name: str) -> str:
    """A wheel's or requirement's project name, normalised as pip compares them."""
    return name.split("-")[0].lower().replace("_", "-") if name.endswith(".whl") else name.lower()


def fetch(carried: Carried, python: str) -> None:
    """Downloads the wheels for CPython ``python`` (e.g. "3.12"), and Horovod's sdist where the
    build travels (needs PyPI)."""
    carried.folder.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    base = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(carried.folder)]
    subprocess.run(
        [*base, "--only-binary=:all:", "--python-version", python, "--implementation", "cp", *platforms]
        + list(carried.specs),
        check=True,
    )
    if "build" in carried.groups:
        subprocess.run([*base, "--no-binary", ":all:", "horovod==0.28.1"], check=True)


def install(carried: Carried) -> str:
    """Installs the carried wheels pip needs into this Python (those already at a fitting version
    are left as they are); returns pip's complaint, or "" when it worked."""
    wanted = [name for group in carried.groups for name in ENTRY_POINTS.get(group, ())]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *wanted],
        env=carried.pip_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip()[-2000:]


def describe(carried: Carried) -> list[str]:
    lines = [f"carry (from {carried.folder}, at most {LIMIT_BYTES // 2**20} MB):"]
    for path in [*carried.wheels, carried.sdist]:
        if path.exists():
            lines.append(f"  {path.name:<60} {path.stat().st_size / 2**20:6.1f} MB")
    for spec in carried.missing():
        lines.append(f"  {spec:<60} missing: run `--fetch` where PyPI is reachable")
    total = carried.size() if carried.folder.is_dir() else 0
    over = "  OVER THE LIMIT: carry fewer checks' needs at a time (--only)" if total > LIMIT_BYTES else ""
    lines.append(f"  in all: {total / 2**20:.1f} MB{over}")
    return lines
