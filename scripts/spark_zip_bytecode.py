"""Adds bytecode to the zips Spark puts first on its Python workers' path.

Spark starts each Python worker (and its daemon) with ``pyspark/python/lib/pyspark.zip`` and
py4j's zip first on ``PYTHONPATH``, ahead of site-packages. Python's zipimport keeps no
bytecode cache: a zip holding sources only is compiled anew by every Python process that
imports from it, so that each worker's daemon spent 0.9 CPU-s importing ``pyspark.daemon``
and ``pyspark.worker`` instead of 0.3 (measured here, Spark 4.3). This rewrites each zip with a
``.pyc`` beside every ``.py`` (where zipimport looks) but pyspark's own tests: unchecked-hash
pycs, as the sources in a zip never change. The sources stay, so tracebacks still show them,
and a Python of another version compiles them as before. Run by ``scripts/setup.sh`` after the
install; a zip that already holds bytecode is left as it is.

    python scripts/spark_zip_bytecode.py [site-packages/pyspark]
"""

from __future__ import annotations

import compileall
import os
import py_compile
import re
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path


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


def main() -> None:
    pyspark = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__import__("pyspark").__file__).parent
    for archive in sorted((pyspark / "python" / "lib").glob("*.zip")):
        if with_bytecode(archive):
            print(f"[setup] bytecode added to {archive.name}", file=sys.stderr)


if __name__ == "__main__":
    main()
