"""The package build's two compiled parts; everything else is in pyproject.toml.

- the timeline viewer's ES module: js/ -> hvd_magic/static/viewer.js (esbuild, via npm);
- the timeline scanner and span matcher: hvd_magic/timeline/_scan.c and _match.c, two small C
  extensions (the fast reader).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
BUNDLE = ROOT / "hvd_magic" / "static" / "viewer.js"
SOURCES = ROOT / "js" / "src"


def bundle_is_stale() -> bool:
    if not BUNDLE.exists():
        return True
    built = BUNDLE.stat().st_mtime
    return any(source.stat().st_mtime > built for source in SOURCES.glob("*.ts"))


class BuildWithViewer(build_py):
    def run(self) -> None:
        if SOURCES.is_dir() and bundle_is_stale():
            npm = shutil.which("npm")
            if npm is None:
                raise SystemExit(
                    "building hvd_magic needs npm to bundle the timeline viewer (js/): install Node.js"
                )
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--silent"], cwd=ROOT / "js", check=True
            )
            subprocess.run([npm, "run", "--silent", "build"], cwd=ROOT / "js", check=True)
        super().run()


class BuildScannerIfPossible(build_ext):
    """The scanner is optional: without a C compiler hvd_magic installs and reads timelines with
    its pure-Arrow reader (slower on large files). Say so in words, not a compiler traceback."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:  # noqa: BLE001 - distutils' compiler errors have no common base here
            self.announce(SCANNER_SKIPPED.format(err=err), level=4)
            print(SCANNER_SKIPPED.format(err=err))


SCANNER_SKIPPED = (
    "hvd_magic: the timeline scanner (a small C extension) was not built ({err}); timelines will be "
    "read by the pure-Arrow reader, slower on large files. Install a C compiler (e.g. "
    "`sudo apt-get install -y gcc`) and reinstall hvd_magic to get it."
)


setup(
    cmdclass={"build_py": BuildWithViewer, "build_ext": BuildScannerIfPossible},
    ext_modules=[
        Extension(f"hvd_magic.timeline.{name}", [f"hvd_magic/timeline/{name}.c"], extra_compile_args=["-O3"])
        for name in ("_scan", "_match")
    ],
)
