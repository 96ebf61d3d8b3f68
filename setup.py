"""The package build's two compiled parts; everything else is in pyproject.toml.

- the timeline viewer's ES module: js/ -> hvd_magic/static/viewer.js (esbuild, via npm);
- the timeline scanner: hvd_magic/timeline/_scan.c, a small C extension (the fast reader).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
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


setup(
    cmdclass={"build_py": BuildWithViewer},
    ext_modules=[
        Extension("hvd_magic.timeline._scan", ["hvd_magic/timeline/_scan.c"], extra_compile_args=["-O3"])
    ],
)
