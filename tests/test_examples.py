"""The examples' own code: MNIST loading from the copy a package ships, the embedded Spark session."""

from __future__ import annotations

import functools
import gzip
import http.server
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

EXAMPLES = Path(__file__).parent.parent / "example_notebooks"
ARTIFACTS = Path(__file__).parent.parent / "test-artifacts"
# an object's repr where a picture was meant, the kernel's warning about its TCP transport
NOISE = r"object at 0x|<IPython\.core\.display|without encryption"
EPOCHS_VARIABLE = "HVD_MAGIC_EXAMPLE_EPOCHS"  # the notebooks' epochs, where they train several
sys.path.insert(0, str(EXAMPLES))

import mnist_data  # noqa: E402

from .helpers import free_port  # noqa: E402

if TYPE_CHECKING:
    import nbformat


@pytest.mark.skipif(
    not mnist_data.NPM_DIGITS.is_dir(), reason="scripts/setup.sh unpacks the npm mnist package"
)
def test_mnist_loads_the_real_digits_the_npm_package_ships_when_the_network_does_not_answer(tmp_path):
    refused = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
    x_train, y_train, x_test, y_test = mnist_data.load_mnist(cache=tmp_path, mirror=refused)
    assert mnist_data.mnist_source(tmp_path) == mnist_data.NPM_SOURCE
    assert len(x_train) + len(x_test) == 10_000
    assert x_train.shape[1:] == (28, 28) and x_train.dtype == np.float32
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.unique(y_train)) == set(range(10))
    assert (tmp_path / "mnist.npz").exists()
    again = mnist_data.load_mnist(cache=tmp_path, npm_digits=tmp_path / "absent")
    assert np.array_equal(again[0], x_train)  # the cache answers without the source


def idx_file(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def test_mnist_comes_from_its_idx_files_when_the_network_answers(tmp_path):
    rng = np.random.default_rng(0)
    served = {"x_train": rng.integers(0, 256, (6, 28, 28)), "y_train": np.arange(6) % 10,
              "x_test": rng.integers(0, 256, (4, 28, 28)), "y_test": np.arange(4)}  # fmt: skip
    site = tmp_path / "site"
    site.mkdir()
    for name, filename in mnist_data.IDX_FILES.items():
        (site / filename).write_bytes(idx_file(served[name]))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            mirror = f"http://127.0.0.1:{server.server_address[1]}/"
            x_train, y_train, x_test, y_test = mnist_data.load_mnist(cache=tmp_path / "cache", mirror=mirror)
        finally:
            server.shutdown()
    assert np.allclose(x_train * 255, served["x_train"]) and x_train.dtype == np.float32
    assert y_test.tolist() == [0, 1, 2, 3]
    assert mnist_data.mnist_source(tmp_path / "cache") == "MNIST's IDX files (6 to train, 4 held out)"


def test_idx_parser_reads_mnist_format():
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in images.shape) + images.tobytes()
    assert np.array_equal(mnist_data.parse_idx(raw), images)


def run_notebook(
    notebook: str, tmp_path: Path, *extra: str, epochs: int | None = None, digits: int | None = None
) -> tuple[str, nbformat.NotebookNode]:
    """Executes an example as `make demo` does (``epochs``: fewer than it trains by default;
    ``digits``: the first so many training digits only); its printed output and the saved notebook."""
    import nbformat  # here: collecting the module does not import it (its jsonschema: 1.7 CPU-s)

    output = tmp_path / notebook
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    if epochs is not None:
        env[EPOCHS_VARIABLE] = str(epochs)
    if digits is not None:
        env[mnist_data.SMOKE_DIGITS_VARIABLE] = str(digits)
    # the notebook's temporary files (its checkpoints, TensorFlow's autograph) go with the test;
    # a short path, as Open MPI's sockets under it need
    with tempfile.TemporaryDirectory(prefix="hvd-nb-") as scratch:
        env["TMPDIR"] = scratch
        done = subprocess.run(
            [sys.executable, str(EXAMPLES.parent / "scripts" / "run_notebook.py"), str(EXAMPLES / notebook),
             "--output", str(output), *extra],
            capture_output=True, text=True, timeout=1200, env=env,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    noise = re.search(f".*({NOISE}).*", done.stdout + done.stderr)
    assert noise is None, f"printed: {noise.group(0)}"  # read as a problem, or as a bug of ours
    return done.stdout, nbformat.read(output, as_version=4)


def final_accuracy(printed: str) -> float:
    last = [line for line in printed.splitlines() if "accuracy" in line][-1]
    return float(re.search(r"accuracy[^0-9]*([0-9.]+)", last).group(1))


def final_records(notebook: nbformat.NotebookNode) -> list[str]:
    """The run records the saved notebook keeps (each run's last display: grid, curves, logs)."""
    return [
        output["data"]["text/html"]
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "hvd-final" in output.get("data", {}).get("text/html", "")
    ]


# Smoke mode: one epoch where a notebook reads EPOCHS_VARIABLE, on the first SMOKE_DIGITS
# training digits (every held-out digit scores it), with an accuracy bound that such a run
# clears and broken training (chance: 0.1) does not. The session notebook trains its two epochs
# in two cells; the main job (below) trains two epochs of `make demo`'s three on the cut.
SMOKE_DIGITS = 4000
# what each printed once the first smoke run here, beside its bound: estimator 0.815, DDP 0.891,
# Keras 0.885, session 0.932; and the notebook's own line that says it trained on SMOKE_DIGITS
SAYS_SMOKE = {
    "mnist_estimator.ipynb": "4,000 training digits",
    "mnist_ddp.ipynb": "4,000 training digits",
    "mnist_session.ipynb": "2000 training digits",  # each rank's half
}


FED_BY_A_TRAINER = ("mnist_hf_trainer.ipynb", "mnist_lightning.ipynb", "mnist_accelerate.ipynb")


@pytest.mark.parametrize(
    ("notebook", "epochs", "bound"),
    [  # each id is the notebook's name: its group in durations.json, whatever its bound
        pytest.param("mnist_estimator.ipynb", 1, 0.7, id="mnist_estimator"),
        pytest.param("mnist_ddp.ipynb", 1, 0.8, id="mnist_ddp"),
        pytest.param("mnist_keras.ipynb", 1, 0.8, id="mnist_keras"),
        pytest.param("mnist_session.ipynb", None, 0.85, id="mnist_session"),
        pytest.param("mnist_hf_trainer.ipynb", 1, 0.8, id="mnist_hf_trainer"),
        pytest.param("mnist_lightning.ipynb", 1, 0.8, id="mnist_lightning"),
        pytest.param("mnist_accelerate.ipynb", 1, 0.8, id="mnist_accelerate"),
    ],
)
def test_example_notebooks_run_headless(notebook, epochs, bound, tmp_path):
    """(The quickstart runs in test_user_install, with a wheel installed as users install it.)"""
    printed, saved = run_notebook(notebook, tmp_path, epochs=epochs, digits=SMOKE_DIGITS)
    assert final_accuracy(printed) >= bound, printed[-2000:]
    assert SAYS_SMOKE.get(notebook, "") in printed, printed[-2000:]  # the cut reached where they train
    if notebook == "mnist_keras.ipynb":
        assert f"data: {mnist_data.mnist_source()}" in printed  # the notebook says which MNIST
    assert "hvd_magic: 2 ranks" in printed  # the run's record, as the notebook keeps it
    if notebook in FED_BY_A_TRAINER:  # the trainer's steps reached the view, with no report() in the cell
        assert re.search(r"hvd_magic: 2 ranks · .* mean of latest: loss [0-9.]+", printed), printed[-2000:]
    if notebook == "mnist_session.ipynb":  # built once, trained in two cells on the same ranks
        assert "live session: 2 ranks" in printed and "after 2 epochs" in printed
        assert "live session stopped: its 2 ranks ended" in printed
    assert final_records(saved), "the saved notebook lost the runs' final records"


def test_the_main_job_writes_an_html_report_that_shows_the_curves(tmp_path):
    """`make demo`: mnist_pytorch.ipynb on the embedded Spark, exported to HTML and opened in Chromium."""
    from .lab import CHROMIUM, CHROMIUM_FLAGS

    report = tmp_path / "mnist_pytorch.html"
    printed, saved = run_notebook(
        "mnist_pytorch.ipynb", tmp_path, "--html", str(report), epochs=2, digits=SMOKE_DIGITS
    )
    assert final_accuracy(printed) >= 0.9, printed[-2000:]  # `make demo`: 0.968 on every digit
    assert f"report: {report}" in printed
    assert f"data: {mnist_data.mnist_source()}" in printed  # the notebook says which MNIST
    assert len(final_records(saved)) >= 3  # training, timeline run, HorovodRunner
    # the live widgets were closed when their runs ended: no plotly script (5 MB a figure) is
    # saved for them, in the notebook or in the report (15.9 MB before)
    assert report.stat().st_size <= 2_000_000
    assert (tmp_path / "mnist_pytorch.ipynb").stat().st_size <= 2_000_000
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(report.as_uri())
        training = page.locator(".hvd-final").first
        training.scroll_into_view_if_needed()
        # each chart: its rendered size and the number of points of its longest line
        charts = training.evaluate(
            "el => [...el.querySelectorAll('svg')].map(svg => [svg.getBoundingClientRect().height,"
            " Math.max(...[...svg.querySelectorAll('polyline')].map(l => l.points.numberOfItems))])"
        )
        page.screenshot(path=str(ARTIFACTS / "mnist_pytorch_report.png"))
        text = page.inner_text("body")
        browser.close()
    (loss_height, loss_points), (accuracy_height, accuracy_points) = charts
    assert loss_height > 50 and accuracy_height > 50  # drawn, not collapsed
    # a loss point per step of the 2 epochs on each rank's half of the cut, an accuracy per epoch
    assert loss_points == 2 * -(-SMOKE_DIGITS // 2 // 64) and accuracy_points == 2
    assert "last rank ready in a negotiation" in text  # the timeline analysis is in the report too
    assert "Horovod Timeline: " in text and "events" in text  # its summary and the file's event count
    assert "Error displaying widget" not in text and "object at 0x" not in text
