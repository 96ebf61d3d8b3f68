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
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ARTIFACTS = Path(__file__).parent.parent / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium (Playwright's), for one or several notebook pages."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def notebook_page(url: str, height: int, browser: Any = None) -> Iterator[Any]:
    """A page of headless Chromium (``browser``'s, in a context of its own, or a browser's of
    its own) on the notebook at ``url``, after "Run All Cells" was clicked."""
    ARTIFACTS.mkdir(exist_ok=True)
    with contextlib.ExitStack() as stack:
        if browser is None:
            browser = stack.enter_context(chromium())
        context = browser.new_context(viewport={"width": 1280, "height": height})
        stack.callback(context.close)
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=90_000)
        page.click("text=Run", timeout=30_000)
        page.click("text=Run All Cells", timeout=30_000)
        yield page


class Lab:
    """A JupyterLab server on ``root``: notebooks in folders under it, each opened in a workspace
    of its own (so that a page shows that notebook only) and run by a kernel of its own, which
    ``close`` shuts down."""

    def __init__(self, root: Path, base: str, token: str) -> None:
        self.root, self.base, self.token = root, base, token

    def notebook(self, folder: Path, cells: list[str]) -> str:
        """``folder/live.ipynb`` of ``cells``; its URL."""
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
        nbformat.write(nb, folder / "live.ipynb")
        where = (folder / "live.ipynb").relative_to(self.root).as_posix()
        workspace = secrets.token_hex(6)
        return f"{self.base}/lab/workspaces/{workspace}/tree/{where}?token={self.token}"

    def close(self, folder: Path) -> None:
        """Shuts down the kernels of the notebooks in ``folder`` (their ranks with them)."""
        where = folder.relative_to(self.root).as_posix() + "/"
        for session in json.loads(self._call("GET", "/api/sessions")):
            if session.get("path", "").startswith(where):
                with contextlib.suppress(urllib.error.HTTPError):  # ended meanwhile
                    self._call("DELETE", f"/api/sessions/{session['id']}")

    def _call(self, method: str, path: str) -> bytes:
        request = urllib.request.Request(f"{self.base}{path}?token={self.token}", method=method)
        with urllib.request.urlopen(request, timeout=30) as answer:
            return bytes(answer.read())


@contextlib.contextmanager
def jupyterlab_server(root: Path, config: str = "") -> Iterator[Lab]:
    """A JupyterLab server on ``root``, until the block ends; ``config``: its
    ``jupyter_server_config.py``."""
    token = secrets.token_hex(16)
    if config:
        (root / "config").mkdir(exist_ok=True)
        (root / "config" / "jupyter_server_config.py").write_text(config)
    runtime = root / "runtime"
    log = open(root / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    # Port 0: the server binds a free port itself. A port picked here and handed over could be taken
    # in between (it was, once: the server moved to the next one and the test knocked on the first).
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--port=0", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, JUPYTER_CONFIG_DIR=str(root / "config"), JUPYTER_RUNTIME_DIR=str(runtime)),
    )  # fmt: skip
    try:
        yield Lab(root, _serving_at(server, runtime, token, root / "jupyterlab.log"), token)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@contextlib.contextmanager
def jupyterlab(folder: Path, cells: list[str]) -> Iterator[str]:
    """A JupyterLab server on ``folder`` with a notebook of ``cells``; yields the notebook's URL."""
    with jupyterlab_server(folder) as lab:
        yield lab.notebook(folder, cells)


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


def coloured_pixels(page: Any, canvas: str) -> int:
    """How many of the canvas's pixels are coloured (neither white nor grey): what a viewer drew."""
    script = """c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (Math.abs(d[i] - d[i + 2]) > 40) n++;
        return n;
    }"""
    return int(page.locator(canvas).first.evaluate(script))
