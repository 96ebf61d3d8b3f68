"""Bytecode where the suite's processes cannot write their own, made once by ``scripts/setup.sh``.

Python writes a module's bytecode beside it on its first import (``make`` lets it, where this
machine sets ``PYTHONDONTWRITEBYTECODE``), so that only what is imported is ever compiled: the
venv's 22,000 modules compiled at install took 107 CPU-s here, most of them never imported.
Two places stay where Python cannot write:

- Spark starts each Python worker (and its daemon) with ``pyspark/python/lib/pyspark.zip`` and
  py4j's zip first on ``PYTHONPATH``, and zipimport keeps no bytecode cache: a zip of sources
  is compiled anew by every process that imports from it (``pyspark.daemon`` and
  ``pyspark.worker``: 0.9 CPU-s a worker's start, 0.3 with bytecode; Spark 4.3). Each zip is
  rewritten with a ``.pyc`` beside every ``.py`` (where zipimport looks) but pyspark's own
  tests: unchecked-hash pycs, as a zip's sources never change. The sources stay, so
  tracebacks show them, and a Python of another version compiles them as before; a zip that
  holds bytecode already is left as it is.
- The multi-host bed's hosts see the venv and the checkout read-only (``tests/multihost.py``):
  what their kernels, Spark workers, fork servers and ranks import is compiled here first, by
  importing it once (``FIRST_IMPORTS``) in a process that may write its bytecode.

Bytecode is kept from one venv to the next, as Horovod's wheel is (``--keep``, after setup and
after ``make test``'s pytest): uv links every venv's files from its cache, so a module's source
has the same size and modification time in each venv, which is all Python checks a ``.pyc``
against. A fresh clone's venv gets the bytecode kept (hard links, into ``__pycache__`` folders
where the source is) instead of compiling its imports anew; a ``.pyc`` whose source differs is
recompiled by Python as ever, and replaced, never written into (Python writes a new file and
renames it), so the kept copy stays as it was. Kept per ``requirements-dev.txt``, two at most.

    python scripts/bytecode.py --take      # the kept bytecode into this venv (setup, before imports)
    python scripts/bytecode.py --keep      # this venv's bytecode kept (after pytest)
    python scripts/bytecode.py --zips      # the zips only (setup, before Spark first runs)
    python scripts/bytecode.py [site-packages/pyspark]   # the zips, the bed's imports; then --keep
"""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import importlib.util
import os
import py_compile
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import warnings
import zipfile
from pathlib import Path

# What the bed's processes import (a missing one is passed over): the frameworks and their
# Horovod bindings, as the fork servers preload them; Spark's driver and ML sides; the kernel's
# and the widgets' stacks; and the whole of hvd_magic.
FIRST_IMPORTS = (
    "torch", "torch._dynamo", "torch.distributed", "tensorflow", "tf_keras", "keras",
    "horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras", "horovod.spark",
    "pyspark.sql", "pyspark.ml", "pyarrow", "pandas", "cloudpickle", "psutil", "zmq",
    "IPython", "ipykernel.kernelapp", "ipywidgets", "anywidget", "plotly.graph_objects",
    "tensorboard.backend.event_processing.event_accumulator", "mlflow",
)  # fmt: skip
IMPORT_ALL = """
import importlib, os, pkgutil, sys
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
def load(name):
    try:
        return importlib.import_module(name)
    except Exception:  # an optional part not installed, or one that needs what is not here
        return None
for name in sys.argv[1:]:
    load(name)
import hvd_magic
for found in pkgutil.walk_packages(hvd_magic.__path__, "hvd_magic."):
    load(found.name)
"""


def with_bytecode(archive: Path) -> bool:
    """Rewrites ``archive`` with bytecode beside its sources; False where it had some already."""
    with zipfile.ZipFile(archive) as old:
        if any(name.endswith(".pyc") for name in old.namelist()):
            return False
        with tempfile.TemporaryDirectory(dir=archive.parent) as scratch:
            old.extractall(scratch)
            tests = re.compile(re.escape(scratch) + r".*[/\\]tests[/\\]")  # pyspark's, never imported
            with warnings.catch_warnings():  # the sources' own (a test's `is` with a literal)
                warnings.simplefilter("ignore")
                ok = compileall.compile_dir(
                    scratch, quiet=2, legacy=True, ddir=str(archive), rx=tests,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )  # fmt: skip
            if not ok:
                raise SystemExit(f"{archive}: a module of it does not compile with {sys.executable}")
            fresh = archive.with_name(archive.name + ".new")
            with zipfile.ZipFile(fresh, "w", zipfile.ZIP_DEFLATED) as new:
                for folder, _, files in sorted(os.walk(scratch)):
                    for file in sorted(files):
                        path = Path(folder, file)
                        new.write(path, path.relative_to(scratch).as_posix())
    fresh.replace(archive)  # whole or not at all: a Spark worker may be reading it
    return True


def compile_first_imports() -> None:
    """Imports ``FIRST_IMPORTS`` and every hvd_magic module in a child, which writes their bytecode."""
    command = [sys.executable, "-c", IMPORT_ALL, *FIRST_IMPORTS]
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before setup's editable install too

from hvd_magic.install import default_cache  # noqa: E402 - the cache Horovod's wheel is kept in

SITE = Path(sysconfig.get_paths()["purelib"])
KEPT_VERSIONS = 2  # per kind of thing kept (bytecode, mypy cache): the newest pins


def pins() -> str:
    """The venv's pinned stack, in short: what is kept per venv is kept under it."""
    return hashlib.sha256((ROOT / "requirements-dev.txt").read_bytes()).hexdigest()[:16]


def kept_folder() -> Path:
    """Where the bytecode of this venv's pinned stack is kept, beside Horovod's wheel."""
    return default_cache() / "bytecode" / f"{sys.implementation.cache_tag}-{pins()}"


def link(source: Path, target: Path) -> bool:
    """``target`` as a hard link to ``source`` (a copy across file systems, whole or not at all);
    False where it exists, or ``source`` is gone (another clone renewed or removed it)."""
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except (FileExistsError, FileNotFoundError):
        return False
    except OSError:
        part = target.with_name(f"{target.name}.{os.getpid()}.part")
        try:
            shutil.copy2(source, part)
            os.replace(part, target)
        except FileNotFoundError:
            return False
    return True


def _bytecode(folder: Path) -> list[Path]:
    """The ``__pycache__`` files of this Python under ``folder`` that a venv of the same pins can
    take: not pytest's rewritten tests, not the editable install's finder (it names its clone)."""
    found = folder.rglob(f"__pycache__/*.{sys.implementation.cache_tag}.pyc")
    return [path.relative_to(folder) for path in found if not path.name.startswith("__editable__")]


def _fresh(name: Path, folder: Path, site: Path) -> bool:
    """Whether Python takes ``folder/name`` (a ``__pycache__`` file) for its source in ``site``:
    this Python's magic number, and the source's modification time and size (or an unchecked hash)."""
    try:
        source = (site / importlib.util.source_from_cache(str(name))).stat()
        with open(folder / name, "rb") as pyc:
            magic, flags, mtime, size = struct.unpack("<4sIII", pyc.read(16))
    except (OSError, ValueError, struct.error):
        return False
    if magic != importlib.util.MAGIC_NUMBER:
        return False
    if flags == 0b01:  # a hash, never checked
        return True
    return flags == 0 and (mtime, size) == (int(source.st_mtime) & 0xFFFFFFFF, source.st_size & 0xFFFFFFFF)


def take_kept(kept: Path, site: Path = SITE) -> tuple[int, set[Path]]:
    """The bytecode kept in ``kept``, linked into ``site`` where its sources are: how many files,
    and where Python does not take all of it (a package installed anew with other times, such
    as pip's install of Horovod's wheel): those top-level packages, or single modules."""
    if not kept.is_dir():
        return 0, set()
    names = [name for name in _bytecode(kept) if (site / name).parent.parent.is_dir()]
    taken = sum(link(kept / name, site / name) for name in names)
    stale = {_installed_as(name) for name in names if not _fresh(name, site, site)}
    return taken, {site / where for where in stale}


def _installed_as(name: Path) -> str:
    """The top-level package (its folder) or module (its file) of a ``__pycache__`` file."""
    return name.parts[0] if name.parts[0] != "__pycache__" else importlib.util.source_from_cache(str(name))


def keep(kept: Path, site: Path = SITE) -> int:
    """The bytecode of ``site``, linked into ``kept`` where it is new there or where the kept file
    is stale and this one is not (beside ``kept``, the folders beyond the newest
    ``KEPT_VERSIONS`` removed); how many files were new or renewed."""
    kept.mkdir(parents=True, exist_ok=True)
    kept.touch()
    prune(kept.parent)
    renewed = 0
    for name in _bytecode(site):
        if (kept / name).exists() and not _fresh(name, kept, site) and _fresh(name, site, site):
            with contextlib.suppress(FileNotFoundError):
                (kept / name).unlink()  # a link: the venvs that took it keep their own
        renewed += link(site / name, kept / name)
    return renewed


def prune(folder: Path, pattern: str = "*") -> None:
    """What is kept per pins in ``folder`` (a folder or a file each, named by ``pattern``): the
    newest ``KEPT_VERSIONS`` stay, the rest go. The one rule for the bytecode and mypy's cache."""
    for old in sorted(folder.glob(pattern), key=_age)[:-KEPT_VERSIONS]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def _age(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # removed by another clone meanwhile
        return 0.0


FIRST_IMPORTS_DONE = "first-imports"  # in the kept folder: for which FIRST_IMPORTS it holds all


def _first_imports_key() -> str:
    return hashlib.sha256(repr((FIRST_IMPORTS, IMPORT_ALL)).encode()).hexdigest()


def _first_imports_kept() -> bool:
    """Whether the kept bytecode holds all that the bed's first imports compile (its marker is
    written, whole, once ``keep`` has linked them)."""
    try:
        return (kept_folder() / FIRST_IMPORTS_DONE).read_text() == _first_imports_key()
    except OSError:
        return False


def _mark_first_imports_kept() -> None:
    marker = kept_folder() / FIRST_IMPORTS_DONE
    part = marker.with_name(f"{marker.name}.{os.getpid()}.part")
    part.write_text(_first_imports_key())
    os.replace(part, marker)


def _pyspark() -> Path:
    return Path(str(__import__("pyspark").__file__)).parent


def zips_with_bytecode(pyspark: Path) -> None:
    for archive in sorted((pyspark / "python" / "lib").glob("*.zip")):
        if with_bytecode(archive):
            print(f"[setup] bytecode added to {archive.name}", file=sys.stderr)


def main() -> None:
    arguments = sys.argv[1:]
    if arguments[:1] == ["--keep"]:
        print(f"[bytecode] {keep(kept_folder())} new files kept in {kept_folder()}", file=sys.stderr)
        return
    if arguments[:1] == ["--zips"]:
        zips_with_bytecode(_pyspark())
        return
    first_imports_kept = _first_imports_kept()  # read before taking: another clone may be keeping
    taken, stale = take_kept(kept_folder())
    if arguments[:1] == ["--take"]:
        if taken:
            print(f"[setup] bytecode from an earlier venv: {taken} files ({kept_folder()})", file=sys.stderr)
        return
    zips_with_bytecode(Path(arguments[0]) if arguments else _pyspark())
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):  # else uv compiled the whole venv (setup.sh)
        if first_imports_kept:  # compiled anew: the checkout's own, and what was installed anew
            for where in sorted(stale) + [ROOT / "hvd_magic"]:
                if where.is_dir():
                    compileall.compile_dir(where, quiet=2)
                elif where.is_file():
                    py_compile.compile(str(where), doraise=False)
        else:
            compile_first_imports()
        print("[setup] bytecode written for what the bed's read-only hosts import", file=sys.stderr)
    keep(kept_folder())
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        _mark_first_imports_kept()


if __name__ == "__main__":
    main()
