"""A user's install, end to end: hvd_magic's wheel built from a clean copy, installed into a new
venv beside the user's own torch, then `install-horovod` (from the cache), `doctor`, and the
quickstart notebook executed with that venv's kernel."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bytecode  # noqa: E402 - scripts/bytecode.py, the bytecode a venv of this suite's pins keeps


def run(command: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=1200, **kwargs)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def uv_install(python: Path) -> list[str | Path]:
    """uv installing into ``python``'s venv from where pip is told to look, as scripts/setup.sh does."""
    return ["bash", ROOT / "scripts" / "uv_install.sh", python]


# what the checkout's tools made (the venv, caches, builds, the GPU check's carry): not the source
MADE_HERE = (".venv", ".git", "static", "*.egg-info", "test-artifacts", "build", "*.so", "node_modules")
MADE_HERE += (".mypy_cache", ".ruff_cache", ".pytest_cache", "_build", ".gpu", "gpu_check-out")


def build_wheel(tmp_path: Path) -> Path:
    """From a clean copy: no prebuilt viewer bundle, no compiled scanner, so the build makes both.
    The JupyterLab extension comes prebuilt, as in a source distribution (its npm build, a minute
    of this test, is the set-up's: scripts/setup.sh)."""
    source = tmp_path / "src"
    made_here = shutil.ignore_patterns(*MADE_HERE)

    def ignored(folder: str, names: list[str]) -> set[str]:
        return set() if Path(folder).match("hvd_magic/labextension") else made_here(folder, names)

    shutil.copytree(ROOT, source, ignore=ignored)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    run([*build, "-w", tmp_path / "dist", source])
    (wheel,) = (tmp_path / "dist").glob("hvd_magic-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hvd_magic/static/viewer.js" in names
    # the JupyterLab extension, prebuilt, and the server extension's switch
    data = "-".join(wheel.name.split("-")[:2]) + ".data/data"
    assert f"{data}/share/jupyter/labextensions/hvd-magic-labextension/package.json" in names
    assert any(
        name.startswith(f"{data}/share/jupyter/labextensions/hvd-magic-labextension/static/remoteEntry.")
        for name in names
    )
    assert f"{data}/etc/jupyter/jupyter_server_config.d/hvd_magic.json" in names
    assert any(re.fullmatch(r"hvd_magic/timeline/_scan\..*\.so", name) for name in names)
    return wheel


def test_a_user_installs_the_wheel_beside_their_torch_and_runs_the_quickstart(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])  # pip comes with the user's packages, below
    python = venv / "bin" / "python"
    # a user's shell, which lets Python keep the bytecode it compiles (this machine's
    # PYTHONDONTWRITEBYTECODE would have every import of the user's torch compile it anew: 2.6x)
    dropped = ("VIRTUAL_ENV", "PYTHONPATH", "PYSPARK_PYTHON", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    # the user's environment as they had it (their torch, a kernel), put together by uv from its
    # cache, where pip would unpack and compile torch's wheel anew (the test: 156 s -> 102 s, unloaded)
    # (venv's own pip, unpacked and compiled by ensurepip, took 6 CPU-s of the test)
    users = ["torch==2.13.0", "jupyterlab==4.6.6", "nbclient", "scikit-learn"]
    run([*uv_install(python), "pip", *users], env=env)
    # the bytecode the suite's own venv keeps for the same files (uv linked both from its cache, so
    # Python takes it as this venv's): the user's first imports compiling torch is not this test's
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    assert bytecode.take_kept(bytecode.kept_folder(), site)[0] > 1000
    # then hvd_magic's wheel, as the README installs it: with pip
    # (without compiling every module of what it installs: Python compiles those imported, once)
    run([python, "-m", "pip", "install", "-q", "--no-compile", f"{wheel}[widgets,timeline]"], env=env)
    # JupyterLab finds the panel's extensions with nothing more to install or build (no node)
    labextensions = run([venv / "bin" / "jupyter", "labextension", "list"], env=env)
    assert re.search(
        r"hvd-magic-labextension v0.1.0 .*enabled.*OK", labextensions.stdout + labextensions.stderr
    )
    server_extensions = run([venv / "bin" / "jupyter", "server", "extension", "list"], env=env)
    listed = server_extensions.stdout + server_extensions.stderr
    assert re.search(r"hvd_magic.server .*enabled", listed) and re.search(r"hvd_magic.server .*OK", listed)
    installed = run([python, "-m", "hvd_magic", "install-horovod"], env=env)
    assert "using the cached wheel" in installed.stdout and "installed horovod-0.28.1" in installed.stdout
    assert "TensorFlow      not installed: left out" in installed.stdout
    checked = run([venv / "bin" / "hvd-magic", "doctor"], env=env)  # the console script
    assert "✓ horovod.torch" in checked.stdout and "all checks passed" in checked.stdout
    assert "horovod.tensorflow" not in checked.stdout  # not installed here: not checked
    notebook = ROOT / "example_notebooks" / "quickstart.ipynb"
    done = run([python, ROOT / "scripts" / "run_notebook.py", notebook], env=env, cwd=tmp_path)
    accuracy = float(re.search(r"final accuracy[^0-9]*([0-9.]+)", done.stdout).group(1))
    assert accuracy > 0.8, done.stdout[-2000:]
    assert "hvd_magic: 2 ranks" in done.stdout
