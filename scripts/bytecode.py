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

    python scripts/bytecode.py [site-packages/pyspark]
"""

from __future__ import annotations

import compileall
import os
import py_compile
import re
import subprocess
import sys
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


def main() -> None:
    pyspark = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__import__("pyspark").__file__).parent
    for archive in sorted((pyspark / "python" / "lib").glob("*.zip")):
        if with_bytecode(archive):
            print(f"[setup] bytecode added to {archive.name}", file=sys.stderr)
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):  # else uv compiled the whole venv (setup.sh)
        compile_first_imports()
        print("[setup] bytecode written for what the bed's read-only hosts import", file=sys.stderr)


if __name__ == "__main__":
    main()
