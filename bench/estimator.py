"""Estimator benchmark, np=2 on the embedded local Spark with the real MNIST digits:

- fit samples/s of ``TorchEstimator`` against the same model and loop written by hand in a
  ``HorovodRunner(np=2, data=df)`` run (target, issue 13: >= 0.9x);
- transform rows/s of the fitted model against a plain pandas UDF with the same module.

Each is the least of ``--repeat`` wall times (the floor is the cost on a shared, noisy machine);
a fit is one short run, so a few epochs keep training, not the launch, in the measure. The
figures are kept for the docs (``figures.py``).

Usage: python bench/estimator.py [--repeat 3] [--epochs 4]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

from figures import keep
from timing import least_seconds

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).parent.parent / "example_notebooks"))


def by_hand(epochs: int, live: bool = False) -> int:
    """The loop a user would write in a %%horovod cell with data=df; ``live``: reporting each
    step's loss to the live view, as the estimator does for its users."""
    import horovod.torch as hvd
    import numpy
    import torch

    import hvd_magic

    hvd.init()
    torch.manual_seed(0)
    table = hvd_magic.shard("arrow")
    x = torch.from_numpy(table.column("image").combine_chunks().flatten().to_numpy().reshape(-1, 784))
    y = torch.from_numpy(table.column("label").to_numpy().astype(numpy.int64))
    net = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=2e-3), net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    for epoch in range(1, epochs + 1):
        steps = torch.randperm(len(x)).split(32)
        for step, index in enumerate(steps, 1):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x[index]), y[index])
            loss.backward()
            optimizer.step()
            if live:
                hvd_magic.report(step=step, total=len(steps), epoch=epoch, loss=loss.item())
    return len(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    import torch
    from mnist_data import spark_frames
    from pyspark.sql.functions import pandas_udf

    from hvd_magic import HorovodRunner
    from hvd_magic.launch.embedded_spark import active_or_embedded_session
    from hvd_magic.spark import TorchEstimator

    session = active_or_embedded_session()
    train_df, test_df = (frame.cache() for frame in spark_frames(session))
    rows, test_rows = train_df.count(), test_df.count()
    quiet = contextlib.redirect_stdout(io.StringIO())

    def estimator_fit() -> object:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        estimator = TorchEstimator(
            num_proc=2, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=2e-3),
            loss=torch.nn.functional.cross_entropy, feature_cols=["image"], label_cols=["label"],
            batch_size=32, epochs=args.epochs, verbose=0,
        )  # fmt: skip
        with quiet, contextlib.redirect_stderr(io.StringIO()):
            return estimator.fit(train_df)

    def hand_written(live: bool) -> object:
        with quiet, contextlib.redirect_stderr(io.StringIO()):
            return HorovodRunner(np=2, data=train_df).run(by_hand, epochs=args.epochs, live=live)

    fit_seconds = least_seconds(estimator_fit, args.repeat)
    hand_seconds = least_seconds(lambda: hand_written(False), args.repeat)
    live_seconds = least_seconds(lambda: hand_written(True), args.repeat)
    model = estimator_fit()
    module = model.module

    @pandas_udf("double")  # type: ignore[call-overload]
    def plain(images):  # the same module, one batch of rows at a time
        import numpy

        batch = torch.from_numpy(numpy.stack(images.to_numpy()).astype(numpy.float32))
        with torch.no_grad():
            return __import__("pandas").Series(module(batch).argmax(dim=1).double().numpy())

    transform_seconds = least_seconds(
        lambda: model.transform(test_df).select("prediction").collect(), args.repeat
    )
    plain_seconds = least_seconds(lambda: test_df.select(plain("image")).collect(), args.repeat)
    samples = rows * args.epochs
    print(f"estimator benchmark: MNIST {rows:,} rows x {args.epochs} epochs, np=2, least of {args.repeat}")
    print(f"  TorchEstimator.fit            {fit_seconds:6.2f} s  {samples / fit_seconds:10,.0f} samples/s")
    print(f"  the same loop with data=df    {hand_seconds:6.2f} s  {samples / hand_seconds:10,.0f} samples/s")
    print(f"  ... reporting each step       {live_seconds:6.2f} s  {samples / live_seconds:10,.0f} samples/s")
    transform_rate = test_rows / transform_seconds
    print(f"  TorchModel.transform          {transform_seconds:6.2f} s  {transform_rate:10,.0f} rows/s")
    print(
        f"  plain pandas UDF              {plain_seconds:6.2f} s  {test_rows / plain_seconds:10,.0f} rows/s"
    )
    print(f"fit: {hand_seconds / fit_seconds:.2f}x the hand-written run's samples/s (target >= 0.9)")
    print(f"fit: {live_seconds / fit_seconds:.2f}x the same loop reporting each step, as the estimator does")
    print(f"transform: {plain_seconds / transform_seconds:.2f}x a plain pandas UDF's rows/s")
    keep(
        "estimator",
        {
            "fit_rate": f"{samples / fit_seconds:,.0f} samples/s",
            "fit_hand": f"{hand_seconds / fit_seconds:.2f}x",
            "fit_live": f"{live_seconds / fit_seconds:.2f}x",
            "transform_rate": f"{transform_rate:,.0f} rows/s",
            "transform_plain": f"{plain_seconds / transform_seconds:.2f}x",
        },
    )
    session.stop()


if __name__ == "__main__":
    main()
