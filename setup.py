"""The package build's compiled parts; everything else is in pyproject.toml.

- the timeline viewer's ES module: js/ -> hvd_magic/static/viewer.js (esbuild, via npm);
- the JupyterLab extension (the Horovod panel): labextension/ -> hvd_magic/labextension/ (via npm),
  installed as share/jupyter/labextensions/hvd-magic-labextension, with the server extension's
  switch (jupyter-config/): a user installs the wheel and needs no node;
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
# (front end's folder, what it builds, other sources it builds from) built by `npm run build`; the
# lab extension's run tabs draw timelines with the viewer's own code (js/src)
BUNDLES = [
    (ROOT / "js", ROOT / "hvd_magic" / "static" / "viewer.js", []),
    (ROOT / "labextension", ROOT / "hvd_magic" / "labextension" / "static" / "style.js", [ROOT / "js/src"]),
]
LAB_EXTENSION = ROOT / "hvd_magic" / "labextension"
LAB_NAME = "hvd-magic-labextension"  # labextension/package.json's name
SERVER_SWITCH = (
    "etc/jupyter/jupyter_server_config.d",
    ["jupyter-config/jupyter_server_config.d/hvd_magic.json"],
)


def is_stale(folder: Path, built: Path, more: list[Path]) -> bool:
    if not built.exists():
        return True
    sources = [*(folder / "src").glob("*.ts"), *(folder / "style").glob("*.css"), folder / "package.json"]
    sources += [source for where in more for source in where.glob("*.ts")]
    return any(source.exists() and source.stat().st_mtime > built.stat().st_mtime for source in sources)


def lab_extension_files() -> list[tuple[str, list[str]]]:
    """The built extension's files, by folder, under Jupyter's share/jupyter/labextensions."""
    folders: dict[str, list[str]] = {}
    for path in sorted(LAB_EXTENSION.rglob("*")):
        if path.is_file():
            where = path.parent.relative_to(LAB_EXTENSION).as_posix()
            target = f"share/jupyter/labextensions/{LAB_NAME}" + ("" if where == "." else f"/{where}")
            folders.setdefault(target, []).append(path.relative_to(ROOT).as_posix())
    return list(folders.items())


class BuildWithViewer(build_py):
    def run(self) -> None:
        for folder, built, more in BUNDLES:
            if folder.is_dir() and is_stale(folder, built, more):
                npm = shutil.which("npm")
                if npm is None:
                    raise SystemExit(
                        f"building hvd_magic needs npm for its front end ({folder.name}/): install Node.js"
                    )
                subprocess.run(
                    [npm, "install", "--no-audit", "--no-fund", "--silent"], cwd=folder, check=True
                )
                subprocess.run([npm, "run", "--silent", "build"], cwd=folder, check=True)
        data_files = self.distribution.data_files  # the list install_data reads: the extension's files too
        if data_files is not None and len(data_files) == 1:
            data_files.extend(lab_extension_files())
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
    data_files=[SERVER_SWITCH],
    ext_modules=[
        Extension(f"hvd_magic.timeline.{name}", [f"hvd_magic/timeline/{name}.c"], extra_compile_args=["-O3"])
        for name in ("_scan", "_match")
    ],
)
