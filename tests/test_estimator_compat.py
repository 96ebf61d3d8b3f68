"""Code written for horovod.spark's estimators (0.28.1) runs with the import changed: the fits
below are written the way horovod's examples/spark/pytorch/pytorch_spark_mnist.py and
examples/spark/keras/keras_spark_mnist.py write theirs (a real horovod ``Store`` and
``SparkBackend``, libsvm MNIST, one-hot labels, a plain Keras loss function), on a real
local-cluster with real MNIST digits."""

from __future__ import annotations

import csv
import os
import sys

import numpy as np
import pytest

from hvd_magic.protocol.files import checkpoint_name

from .estimator_fixtures import libsvm_mnist, mnist_frames
from .helpers import leftover_processes
from .spark_fixtures import BARRIER_FAILS_FAST, TWO_EXECUTORS, shared_spark_session

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


@pytest.fixture(scope="module")
def spark():
    with shared_spark_session(TWO_EXECUTORS, BARRIER_FAILS_FAST) as session:
        from hvd_magic.launch.spark_session import check_slots

        check_slots(session, 2, wait=60)
        yield session


def horovods_arguments(framework: str) -> list[str]:
    """The arguments of horovod.spark's estimator's ``__init__``, read from the installed
    Horovod 0.28.1 (its torch module does not import here without tensorboard)."""
    import ast
    import importlib.util

    path = importlib.util.find_spec("horovod.spark").submodule_search_locations[0]
    tree = ast.parse(open(os.path.join(path, framework, "estimator.py")).read())
    name = {"torch": "TorchEstimator", "keras": "KerasEstimator"}[framework]
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    init = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    return [arg.arg for arg in init.args.args[1:]]


def test_every_horovod_spark_argument_is_taken_and_what_has_no_use_is_said(spark, tmp_path):
    """No fit: each argument of horovod.spark's estimators is a Param here, with horovod's
    accessor names; num_proc comes from backend= or Spark's default parallelism; store= (a
    path, or a duck-typed Store) gives the run folder; the arguments with no use are named."""
    import keras
    import torch
    from horovod.spark.common.backend import SparkBackend

    from hvd_magic.spark import KerasEstimator, TorchEstimator
    from hvd_magic.spark.compat import destination, num_proc

    for framework, cls in (("torch", TorchEstimator), ("keras", KerasEstimator)):
        names = horovods_arguments(framework)
        assert len(names) > 35 and [name for name in names if not cls().hasParam(name)] == []
    df = spark.range(4)
    assert num_proc(TorchEstimator(), df) == 2  # local-cluster[2,1,...]: spark.default.parallelism
    assert num_proc(KerasEstimator(backend=SparkBackend(num_proc=3)), df) == 3

    class DuckStore:
        prefix_path = str(tmp_path / "duck")

    assert (
        destination(KerasEstimator(store=DuckStore(), run_id="r"), "keras").location
        == f"{tmp_path}/duck/runs/r"
    )
    assert destination(TorchEstimator(store="s3://bucket/work", run_id="r"), "pytorch").location == (
        "s3://bucket/work/runs/r"
    )
    net = torch.nn.Linear(2, 2)
    torch_estimator = TorchEstimator(
        model=net, callbacks=[keras.callbacks.CSVLogger("x.csv")], shuffle_buffer_size=1000,
        reader_pool_type="process", train_reader_num_workers=4, sample_weight_col="w", use_gpu=False,
        transformation_fn=lambda row: row, inmemory_cache_all=True,
        val_reader_num_workers=2,  # horovod.spark's default: no note
    )  # fmt: skip
    assert torch_estimator.getShufflingBufferSize() == 1000 and torch_estimator.getTrainReaderNumWorker() == 4
    assert torch_estimator.getInMemoryCacheAll() and torch_estimator.getUseGpu() is False
    noted = [line.split("=")[0] for line in torch_estimator.notes()]
    assert noted == [
        f"TorchEstimator: {name}"
        for name in (
            "sample_weight_col", "shuffle_buffer_size", "transformation_fn", "train_reader_num_workers",
            "reader_pool_type", "callbacks",
        )
    ]  # fmt: skip
    keras_notes = KerasEstimator(backward_passes_per_step=2, label_shapes=[[-1, 10]]).notes()
    assert [line.split("=")[0] for line in keras_notes] == [
        "KerasEstimator: label_shapes",
        "KerasEstimator: backward_passes_per_step",
    ]


def evaluate_like_horovods_examples(model, test_df) -> float:
    """The examples' last lines: name the output column, argmax it with a UDF, evaluate."""
    import pyspark.sql.types as T
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.sql.functions import udf

    pred_df = model.setOutputCols(["label_prob"]).transform(test_df)
    argmax = udf(lambda v: float(np.argmax(v)), returnType=T.DoubleType())
    pred_df = pred_df.withColumn("label_pred", argmax(pred_df.label_prob))
    evaluator = MulticlassClassificationEvaluator(
        predictionCol="label_pred", labelCol="label", metricName="accuracy"
    )
    return evaluator.evaluate(pred_df)


def test_pytorch_spark_mnist_as_horovods_example_writes_it(spark, tmp_path, capsys):
    """store= (a real Store: checkpoints and the model in its run folder), backend= (its
    num_proc), input_shapes= (the conv net gets 1x28x28 images from a flat vector),
    backward_passes_per_step=, and an argument with no use here (a note, not an error)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.optim as optim
    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store

    from hvd_magic.spark import TorchEstimator, TorchModel

    store = Store.create(str(tmp_path / "work"))
    train_df, test_df = libsvm_mnist(spark, tmp_path, rows=3000)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
            self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
            self.fc1 = nn.Linear(320, 50)
            self.fc2 = nn.Linear(50, 10)

        def forward(self, features):
            x = features.float()
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2(x), 2))
            x = x.view(-1, 320)
            x = F.relu(self.fc1(x))
            return F.log_softmax(self.fc2(x), dim=1)

    with torch.random.fork_rng():  # seeded here only: horovod's example leaves it to chance
        torch.manual_seed(1)
        model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss = nn.NLLLoss()
    backend = SparkBackend(
        num_proc=2, stdout=sys.stdout, stderr=sys.stderr, prefix_output_with_timestamp=True
    )
    torch_estimator = TorchEstimator(
        backend=backend,
        store=store,
        model=model,
        optimizer=optimizer,
        loss=lambda input, target: loss(input, target.long()),
        input_shapes=[[-1, 1, 28, 28]],
        feature_cols=["features"],
        label_cols=["label"],
        batch_size=16,
        epochs=2,
        validation=0.1,
        backward_passes_per_step=2,
        verbose=1,
        run_id="mnist",
        partitions_per_process=4,
    )
    torch_model = torch_estimator.fit(train_df)
    assert evaluate_like_horovods_examples(torch_model, test_df) >= 0.85  # 0.904-0.908 over 3 runs here
    run = tmp_path / "work" / "runs" / "mnist"  # the Store's run path for run_id
    assert sorted(os.listdir(run / "checkpoints")) == [checkpoint_name(1), checkpoint_name(2)]
    assert TorchModel.load(str(run / "model")).history == torch_model.history
    assert torch_model.getRunId() == "mnist"
    said = capsys.readouterr().err
    assert "partitions_per_process= is not used here: no intermediate Parquet files" in said
    assert "backend= gives its num_proc and env; its prefix_output_with_timestamp, stderr, stdout" in said
    assert leftover_processes() == []


def test_accumulation_compression_loss_constructors_and_a_minibatch_function(spark):
    """Full-batch descent, whatever the rows' order in a shard: two batches of 448 rows
    accumulated (backward_passes_per_step=2) whose gradients a compression halves, at lr 1.0,
    are one batch of 896 at lr 0.5 (its loss from loss_constructors); a train_minibatch_fn
    that steps every batch (horovod.spark's signature) is used instead of ours."""
    import pandas as pd
    import torch
    from horovod.torch.compression import Compressor
    from sklearn.datasets import load_digits

    from hvd_magic.spark import TorchEstimator

    class Halves(Compressor):
        @staticmethod
        def compress(tensor):
            return tensor * 0.5, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor

    def every_batch(model, optimizer, transform_outputs, loss_fn, inputs, labels, weights, passes, index):
        optimizer.zero_grad()
        outputs, labels = transform_outputs(model(*inputs), labels)
        loss = loss_fn(outputs, labels, weights)
        loss.backward()
        optimizer.step()
        return outputs, loss

    digits = load_digits()
    frame = pd.DataFrame({"features": list(digits.data[:1792] / 16.0), "label": digits.target[:1792]})
    df = spark.createDataFrame(frame)  # 896 rows a rank

    def fitted(batch_size, passes, lr, **given):
        torch.manual_seed(0)
        net = torch.nn.Linear(64, 10)
        estimator = TorchEstimator(
            num_proc=2, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=lr),
            feature_cols=["features"], label_cols=["label"], batch_size=batch_size, epochs=3, verbose=0,
            backward_passes_per_step=passes,
            **({"loss": torch.nn.functional.cross_entropy} | given),
        )  # fmt: skip
        return estimator.fit(df).getModel().weight.detach()

    one_batch = fitted(896, 1, 0.5, loss=None, loss_constructors=[lambda **_: torch.nn.CrossEntropyLoss()])
    torch.testing.assert_close(
        fitted(448, 2, 1.0, gradient_compression=Halves), one_batch, rtol=1e-4, atol=1e-6
    )
    assert not torch.allclose(fitted(448, 2, 0.5, train_minibatch_fn=every_batch), one_batch, atol=1e-3)
    assert leftover_processes() == []


def test_keras_spark_mnist_as_horovods_example_writes_it(spark, tmp_path, capsys):
    """A store at an fsspec URL (memory://), backend=, a flat 784-vector reshaped to the conv
    model's (28, 28, 1) input, a one-hot vector label with the plain function
    keras.losses.categorical_crossentropy, metrics= without validation= (training metrics,
    as Keras reports them), and a TensorBoard callback whose logs land in the store."""
    import fsspec
    import keras
    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store
    from keras.layers import Conv2D, Dense, Flatten, MaxPooling2D
    from keras.models import Sequential

    from hvd_magic.spark import KerasEstimator, KerasModel

    store = Store.create(f"memory://hvd-magic-tests/{tmp_path.name}")
    train_df, test_df = libsvm_mnist(spark, tmp_path, rows=3000, label_vec=True)
    keras.utils.set_random_seed(1)
    model = Sequential()
    model.add(keras.Input((28, 28, 1)))
    model.add(Conv2D(8, kernel_size=(3, 3), activation="relu"))
    model.add(MaxPooling2D(pool_size=(2, 2)))
    model.add(Flatten())
    model.add(Dense(10, activation="softmax"))
    backend = SparkBackend(
        num_proc=2, stdout=sys.stdout, stderr=sys.stderr, prefix_output_with_timestamp=True
    )
    keras_estimator = KerasEstimator(
        backend=backend,
        store=store,
        model=model,
        optimizer=keras.optimizers.Adadelta(1.0),
        loss=keras.losses.categorical_crossentropy,
        metrics=["accuracy"],
        feature_cols=["features"],
        label_cols=["label_vec"],
        batch_size=64,
        epochs=2,
        random_seed=1,
        inmemory_cache_all=True,
        verbose=1,
        callbacks=[keras.callbacks.TensorBoard(profile_batch=5)],
    )
    keras_model = keras_estimator.fit(train_df)
    assert evaluate_like_horovods_examples(keras_model, test_df) >= 0.85
    assert [sorted(epoch) for epoch in keras_model.history] == [["accuracy", "loss"]] * 2
    assert keras_model.history[1]["accuracy"] > 0.8
    run = store.get_run_path(keras_model.getRunId())
    assert keras_model.getRunId().startswith("keras_")  # horovod.spark's default run_id
    root = fsspec.core.url_to_fs(run)[1]
    files = [path[len(root) :] for path in store.fs.find(root)]
    assert any(path.startswith("/logs/train/events.out.tfevents") for path in files)  # TensorBoard's logs
    assert {
        f"/checkpoints/{checkpoint_name(1)}",
        f"/checkpoints/{checkpoint_name(2)}",
        "/model/model.keras",
    } <= set(files)
    exported = KerasModel.load(f"{run}/model")  # through fsspec
    assert exported.history == keras_model.history
    assert "backend= gives its num_proc and env" in capsys.readouterr().err
    assert leftover_processes() == []


def test_keras_callbacks_files_validation_column_and_an_unfitted_pipeline(spark, tmp_path):
    """A Pipeline holding the estimator saves and loads before fit; validation= names a boolean
    column (the kept epoch's val_accuracy, over batches of val_batch_size, is the fitted
    model's accuracy on exactly those rows); keras.losses.sparse_categorical_crossentropy (a
    function) trains; train_steps_per_epoch= (past one pass) and backend_env= reach the ranks;
    callbacks' files (a relative ModelCheckpoint pattern, a CSVLogger in a given folder, and
    checkpoint_callback's, which keeps the best model) arrive in model_dir."""
    import keras
    from pyspark.ml import Pipeline
    from pyspark.sql import functions as F

    from hvd_magic.spark import KerasEstimator

    train_df, _ = mnist_frames(spark)
    df = train_df.limit(3000).withColumn("is_val", F.hash("image") % 5 == 0)  # a fifth, the same each time
    keras.utils.set_random_seed(0)
    layers = [
        keras.Input((784,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ]
    net = keras.Sequential(layers)
    given_dir = tmp_path / "given"
    given_dir.mkdir()
    best = keras.callbacks.ModelCheckpoint("x.keras", monitor="val_loss", save_best_only=True)

    class Batches(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.seen = 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1

        def on_epoch_end(self, epoch, logs=None):
            logs.update(batches=self.seen, marked=float(os.environ.get("HVD_MAGIC_MARK") == "on"))

    estimator = KerasEstimator(
        num_proc=2, model=net, optimizer=keras.optimizers.Adam(2e-3), metrics=["accuracy"],
        loss=keras.losses.sparse_categorical_crossentropy, feature_cols=["image"], label_cols=["label"],
        validation="is_val", batch_size=32, epochs=2, verbose=0, model_dir=str(tmp_path / "run"),
        train_steps_per_epoch=45, val_batch_size=50, use_gpu=False, backend_env={"HVD_MAGIC_MARK": "on"},
        callbacks=[
            Batches(),
            keras.callbacks.ModelCheckpoint("checkpoints/model-{epoch:02d}.keras"),
            keras.callbacks.CSVLogger(str(given_dir / "history.csv")),
        ],
        checkpoint_callback=best,
    )  # fmt: skip
    Pipeline(stages=[estimator]).save(str(tmp_path / "pipeline"))
    fitted = Pipeline.load(str(tmp_path / "pipeline")).fit(df).stages[0]
    assert [sorted(epoch) for epoch in fitted.history] == [
        ["accuracy", "batches", "loss", "marked", "val_accuracy", "val_loss"]
    ] * 2
    assert [(epoch["batches"], epoch["marked"]) for epoch in fitted.history] == [(45, 1.0)] * 2  # 38 a pass
    assert fitted.history[-1]["accuracy"] > 0.85
    kept = min(fitted.history, key=lambda epoch: epoch["val_loss"])  # what checkpoint_callback kept
    held = fitted.transform(df.where("is_val")).select("label", "prediction").toPandas()
    assert kept["val_accuracy"] == pytest.approx(
        float(np.mean(held["label"] == held["prediction"])), abs=1e-6
    )
    run = tmp_path / "run"
    assert {"model-01.keras", "model-02.keras"} <= set(os.listdir(run / "checkpoints"))
    with open(run / "history.csv") as logged:
        rows = list(csv.DictReader(logged))
    assert [float(row["val_accuracy"]) for row in rows] == pytest.approx(
        [e["val_accuracy"] for e in fitted.history]
    )
    saved = keras.saving.load_model(str(run / "checkpoint.keras"), compile=False)
    for kept_weights, returned in zip(saved.get_weights(), fitted.getModel().get_weights(), strict=True):
        np.testing.assert_array_equal(
            kept_weights, returned
        )  # the fitted model is the one checkpoint_callback kept
    assert leftover_processes() == []
