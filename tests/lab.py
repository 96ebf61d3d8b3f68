"""A real JupyterLab and headless Chromium on one of its notebooks: for tests/test_browser.py,
tests/test_examples.py and bench/timeline_scale.py --browser."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat

ARTIFACTS = Path(__file__).parent.parent / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip


@contextlib.contextmanager
def notebook_page(url: str, height: int) -> Iterator[Any]:
    """Headless Chromium on the notebook at ``url``, after "Run All Cells" was clicked."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": height})
        page.goto(url)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=90_000)
        page.click("text=Run", timeout=30_000)
        page.click("text=Run All Cells", timeout=30_000)
        yield page
        browser.close()


@contextlib.contextmanager
def jupyterlab(folder: Path, cells: list[str]) -> Iterator[str]:
    """A JupyterLab server on ``folder`` with a notebook of ``cells``; yields the notebook's URL."""
    token = secrets.token_hex(16)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
    nbformat.write(nb, folder / "live.ipynb")
    runtime = folder / "runtime"
    log = open(folder / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    # Port 0: the server binds a free port itself. A port picked here and handed over could be taken
    # in between (it was, once: the server moved to the next one and the test knocked on the first).
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--port=0", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}", "--allow-root"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, JUPYTER_CONFIG_DIR=str(folder / "config"), JUPYTER_RUNTIME_DIR=str(runtime)),
    )  # fmt: skip
    try:
        base = _serving_at(server, runtime, token, folder / "jupyterlab.log")
        yield f"{base}/lab/tree/live.ipynb?token={token}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _serving_at(server: subprocess.Popen[bytes], runtime: Path, token: str, log: Path) -> str:
    """The base URL ``server`` answers on, within 90 s: its port read from the file it writes
    as it starts (``jpserver-<pid>.json``; it binds the port a moment later)."""
    info = runtime / f"jpserver-{server.pid}.json"
    deadline = time.monotonic() + 90
    base = None
    while True:
        try:
            if base is None:
                base = f"http://127.0.0.1:{int(json.loads(info.read_text())['port'])}"
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            return base
        except (OSError, ValueError, KeyError):  # no file yet, half written, or not listening yet
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            assert server.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
