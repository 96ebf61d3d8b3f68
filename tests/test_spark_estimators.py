"""TorchEstimator and KerasEstimator on a real local-cluster with real MNIST digits: fit with
np=2, transform held-out rows, save/load, resume from checkpoints, Pipeline and CrossValidator,
and bad input refused before anything launches."""

from __future__ import annotations

import os

import pytest

from hvd_magic import CaptureError, DataError, RankFailedError
from hvd_magic.protocol.files import checkpoint_name

from .estimator_fixtures import accuracy, mnist_frames, mnist_net
from .estimator_records import active_mlflow_run, check_fit_records
from .helpers import run_processes_anywhere
from .spark_fixtures import BARRIER_FAILS_FAST, TWO_EXECUTORS, shared_spark_session


@pytest.fixture(scope="module")
def spark():
    with shared_spark_session(TWO_EXECUTORS, BARRIER_FAILS_FAST) as session:
        from hvd_magic.launch.spark_session import check_slots

        check_slots(session, 2, wait=60)
        yield session


@pytest.fixture(scope="module")
def mnist(spark):
    return mnist_frames(spark)


def torch_estimator(**overrides):
    import torch

    from hvd_magic.spark import TorchEstimator

    net = mnist_net()
    params = dict(
        num_proc=2,
        model=net,
        optimizer=torch.optim.Adam(net.parameters(), lr=2e-3),
        loss=torch.nn.functional.cross_entropy,
        metrics=["accuracy"],
        feature_cols=["image"],
        label_cols=["label"],
        batch_size=32,
        epochs=2,
        validation=0.1,
    )
    return TorchEstimator(**(params | overrides))


def digits_estimator(net, optimizer, **extra):
    """An estimator for scikit-learn's 8x8 digits in a ``features`` column (no validation)."""
    return torch_estimator(
        model=net,
        optimizer=optimizer,
        feature_cols=["features"],
        metrics=[],
        validation=0.0,
        verbose=0,
        **extra,
    )


@pytest.fixture
def live_views(monkeypatch):
    """The live views the runs draw into (real ``LiveView``s on ipywidgets' test comm, as in a
    kernel): the estimator's fit has no cell to show them in here."""
    from ipywidgets.widgets.tests.utils import setup_test_comm, teardown_test_comm

    from hvd_magic.run import supervisor
    from hvd_magic.widgets.live_view import LiveView

    views: list[LiveView] = []

    def make_view(ranks: int) -> LiveView:
        views.append(LiveView(ranks, show=False))
        return views[-1]

    setup_test_comm()
    monkeypatch.setattr(supervisor, "make_view", make_view)
    yield views
    teardown_test_comm()


def raw_outputs(predicted) -> list[list[float]]:
    """The ``rawPrediction`` column of a transformed DataFrame, row by row."""
    return [list(row) for row in predicted.select("rawPrediction").toPandas()["rawPrediction"]]


def test_torch_estimator_fits_mnist_transforms_held_out_digits_and_its_saved_model_loads(
    mnist, tmp_path, live_views
):
    """One fit on MNIST: its records (TensorBoard, MLflow, the live view), held-out accuracy;
    then the model saved and loaded back, and the export the fit left in a plain-folder
    model_dir, give identical predictions, and the module file alone does outside Spark. A
    second fit into that model_dir, named as a URL (pyarrow's file://), resumes from its latest
    checkpoint (a retry resuming: test_a_fit_that_loses_a_rank_starts_again_on_its_own...)."""
    import cloudpickle
    import torch

    from hvd_magic.spark import TorchModel

    train_df, test_df = mnist
    with active_mlflow_run(tmp_path) as (mlflow_client, run_id):  # a notebook's mlflow.start_run()
        model = torch_estimator(model_dir=str(tmp_path / "run")).fit(train_df)
    check_fit_records(tmp_path / "run", mlflow_client, run_id, model)  # TensorBoard's files, MLflow's run
    (view,) = live_views  # each epoch's metrics reached the live view, named as in the history
    for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
        for rank in (0, 1):
            curve = view.model.series[name][rank]
            assert curve.values == pytest.approx([epoch[name] for epoch in model.history], rel=1e-5)
            assert len(set(curve.steps)) == 2 and curve.steps == sorted(curve.steps)
    batches = view.model.series["batch_loss"][0]  # and each batch's loss, its step counting on
    assert (
        batches.steps == sorted(set(batches.steps))
        and batches.steps[-1] == view.model.series["loss"][0].steps[-1]
    )
    assert [progress.epoch for progress in view.model.progress] == [2, 2]
    assert {trace.name for trace in view.figure.data} >= {"rank 0", "rank 1"}  # a curve was drawn
    assert [sorted(epoch) for epoch in model.history] == [
        ["accuracy", "loss", "val_accuracy", "val_loss"]
    ] * 2
    assert model.history[1]["val_loss"] < model.history[0]["val_loss"]
    predicted = model.transform(test_df)
    assert accuracy(predicted) >= 0.9
    assert predicted.schema["rawPrediction"].dataType.simpleString() == "array<float>"
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == [checkpoint_name(1), checkpoint_name(2)]
    assert {"state_dict.pt", "module.pkl", "metadata"} <= set(os.listdir(tmp_path / "run" / "model"))
    assert "epoch 2: loss" in view.model.logs[0].text()  # rank 0's line per epoch
    # Saved and loaded back, and the export in model_dir: the same model, the same numbers.
    before = raw_outputs(predicted)
    model.save(str(tmp_path / "saved"))
    loaded = TorchModel.load(str(tmp_path / "saved"))
    assert loaded.uid == model.uid and loaded.history == model.history
    assert raw_outputs(loaded.transform(test_df)) == before
    exported = TorchModel.load(str(tmp_path / "run" / "model"))
    assert exported.history == model.history and raw_outputs(exported.transform(test_df)) == before
    # Outside Spark: the module file alone gives the same numbers.
    with open(tmp_path / "saved" / "module.pkl", "rb") as blob:
        module = cloudpickle.load(blob)
    first = test_df.select("image").first()[0]
    with torch.no_grad():
        alone = module(torch.tensor([first], dtype=torch.float32))[0].tolist()
    assert alone == pytest.approx(before[0], abs=1e-5)
    with torch.no_grad():  # getModel(), as horovod.spark's TorchModel has it
        assert loaded.getModel()(torch.tensor([first]))[0].tolist() == pytest.approx(alone, abs=1e-6)
    # A second fit with one epoch more, into the same folder named as a URL (pyarrow's file://):
    # epochs 1 and 2 come from the checkpoints, only epoch 3 is trained, and its export loads back.
    url = f"file://{tmp_path}/run"
    resumed = torch_estimator(epochs=3, model_dir=url).fit(train_df.limit(2000))
    trained = live_views[1].model.logs[0].text()  # rank 0's line for each epoch it trains
    assert "epoch 3: loss" in trained and "epoch 1: loss" not in trained and "epoch 2: loss" not in trained
    assert len(resumed.history) == 3 and resumed.history[:2] == model.history
    checkpoints = [checkpoint_name(epoch) for epoch in (1, 2, 3)]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == checkpoints
    exported = TorchModel.load(f"{url}/model")  # the fitted model, exported into model_dir
    assert exported.history == resumed.history
    for name, weights in resumed.getModel().state_dict().items():
        assert torch.equal(exported.getModel().state_dict()[name], weights), name
    some = test_df.limit(200)  # and, loaded from the URL, it predicts as the fitted model does
    assert raw_outputs(exported.transform(some)) == raw_outputs(resumed.transform(some))
    assert run_processes_anywhere() == []


def fragile_net(marks, fault: str, after=None):
    """mnist_net, whose rank 1 has ``fault`` at its 11th training batch (the first of epoch 2
    with train_steps_per_epoch=10), once ``after`` exists (epoch 1's checkpoint, landed whole):
    'kill' kills its own process (SIGKILL), else it raises ValueError. Once: the marker file
    ``marks/hit`` is there for a retry's ranks, and for transform on the executors."""
    import torch

    class Fragile(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net, self.batches = net, 0

        def forward(self, x):
            hit = os.path.join(str(marks), "hit")
            if self.training and not os.path.exists(hit):
                import horovod.torch as hvd

                self.batches += 1
                if self.batches == 11 and hvd.rank() == 1:
                    import signal
                    import time

                    deadline = time.monotonic() + 120
                    while after is not None and not os.path.exists(after) and time.monotonic() < deadline:
                        time.sleep(0.02)  # rank 0 sends epoch 1's checkpoint in the background
                    open(hit, "w").close()
                    if fault == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    raise ValueError("bad batch")
            return self.net(x)

    return Fragile(mnist_net())  # made here: the ranks cannot import this module's functions


def test_a_fit_that_loses_a_rank_starts_again_on_its_own_from_the_last_epoch(mnist, tmp_path, capsys):
    """retries (default 2): rank 1 killed at epoch 2's first batch; the fit finishes on its
    second attempt, which resumes from epoch 1's checkpoint in model_dir (not trained again)."""
    import cloudpickle
    import torch

    train_df, _ = mnist
    checkpoints = tmp_path / "run" / "checkpoints"
    net = fragile_net(tmp_path, "kill", after=checkpoints / checkpoint_name(1))
    estimator = torch_estimator(
        model=net, optimizer=torch.optim.Adam(net.parameters(), lr=2e-3), epochs=3,
        train_steps_per_epoch=10, model_dir=str(tmp_path / "run"),
    )  # fmt: skip
    model = estimator.fit(train_df.limit(2000))
    shown = capsys.readouterr()
    assert "killed from outside: rank 1 " in shown.err and "attempt 2 of 3 from epoch 1" in shown.err
    assert "finished on attempt 2 of 3" in shown.err
    trained = [shown.out.count(f"epoch {epoch}: loss") for epoch in (1, 2, 3)]  # rank 0's lines
    assert trained == [1, 1, 1]  # epoch 1 once: the second attempt resumed after it
    assert len(model.history) == 3
    assert sorted(os.listdir(checkpoints)) == [checkpoint_name(epoch) for epoch in (1, 2, 3)]
    first = cloudpickle.loads((checkpoints / checkpoint_name(1)).read_bytes())
    assert model.history[0] == first["history"][0] and first["epoch"] == 1
    assert run_processes_anywhere() == []


def test_an_exception_of_the_model_is_not_retried(mnist, tmp_path, capsys):
    import torch

    train_df, _ = mnist
    net = fragile_net(tmp_path, "raise")
    estimator = torch_estimator(
        model=net, optimizer=torch.optim.Adam(net.parameters()), epochs=2, train_steps_per_epoch=10
    )
    with pytest.raises(RankFailedError, match="ValueError: bad batch"):
        estimator.fit(train_df.limit(2000))
    assert "attempt 2" not in capsys.readouterr().err  # retries=2 by default, none used
    assert run_processes_anywhere() == []


def test_a_cross_validator_over_a_pipeline_fits_each_grid_point_and_the_best_saves_and_loads(spark, tmp_path):
    """CrossValidator over a Pipeline (VectorAssembler, then TorchEstimator): each fold fits each
    grid point with its own epochs (not the estimator's), the better one is chosen and fitted on
    all rows; the best PipelineModel transforms, saves and loads."""
    import pandas as pd
    import torch
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
    from sklearn.datasets import load_digits

    digits = load_digits()
    columns = [f"p{i}" for i in range(64)]
    frame = pd.DataFrame(digits.data / 16.0, columns=columns).assign(label=digits.target)
    df = spark.createDataFrame(frame)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    estimator = digits_estimator(net, torch.optim.Adam(net.parameters(), lr=1e-2), epochs=1)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=columns, outputCol="features"), estimator])
    grid = ParamGridBuilder().addGrid(estimator.epochs, [1, 5]).build()
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    search = CrossValidator(
        estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, collectSubModels=True
    )
    best = search.fit(df)  # 2 folds x 2 grid points, then the best one's fit on all rows: 5 fits
    assert len(best.avgMetrics) == 2 and best.avgMetrics[1] > best.avgMetrics[0] >= 0.5  # more epochs, better
    fold_epochs = [[len(model.stages[-1].history) for model in fold] for fold in best.subModels]
    assert fold_epochs == [[1, 5], [1, 5]]  # each fold's fits ran with the grid's epochs
    fitted = best.bestModel
    assert fitted.stages[-1].getOrDefault("batch_size") == 32 and len(fitted.stages[-1].history) == 5
    fitted_accuracy = accuracy(fitted.transform(df))
    assert fitted_accuracy >= 0.9
    fitted.save(str(tmp_path / "pipeline"))
    again = PipelineModel.load(str(tmp_path / "pipeline"))
    assert accuracy(again.transform(df)) == fitted_accuracy
    assert run_processes_anywhere() == []


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"feature_cols": ["pixels"]}, DataError, "no column 'pixels'; its columns: image, label"),
        ({"store": object()}, TypeError, "store= takes horovod.spark's Store"),
        ({"store": "/tmp/x", "model_dir": "/tmp/y"}, ValueError, "give store= or model_dir=, not both"),
        ({"backend": object(), "num_proc": 2}, ValueError, "give num_proc= or backend=, not both"),
        ({"metrics": ["mae"]}, ValueError, "metric 'mae' is not one it computes"),
        ({"validation": "is_val"}, DataError, "the DataFrame has no column 'is_val'"),
        (
            {"validation": "image"},
            DataError,
            "validation column 'image' is array<float>; a validation column must be boolean",
        ),
        ({"validation": 1.5}, ValueError, r"validation=1.5: give a share of the rows from 0 up to"),
        ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step must be 1 or more"),
        ({"loss_constructors": [lambda **_: None]}, ValueError, "needs one of loss= and loss_constructors="),
        ({"frobnicate": 1}, TypeError, "has no parameter frobnicate"),
        ({"retries": -1}, ValueError, "TorchEstimator: retries must be 0 or more, got -1"),
        ({"retries": 0, "min_np": 1}, ValueError, "TorchEstimator: min_np=1 goes on with fewer ranks"),
    ],
)
def test_bad_input_is_refused_before_launch(mnist, change, error, message):
    train_df, _ = mnist
    with pytest.raises(error, match=message):
        torch_estimator(**change).fit(train_df)
    assert run_processes_anywhere() == []


def test_an_empty_dataframe_and_an_unpicklable_model_are_refused_before_launch(mnist):
    import threading

    train_df, _ = mnist
    with pytest.raises(DataError, match="has no rows"):
        torch_estimator().fit(train_df.limit(0))
    net = mnist_net()
    net.lock = threading.Lock()
    with pytest.raises(CaptureError, match="cannot be pickled"):
        torch_estimator(model=net).fit(train_df)
    assert run_processes_anywhere() == []


def test_keras_estimator_fits_mnist_transforms_saves_loads_and_a_second_fit_resumes(mnist, tmp_path, capsys):
    """A fit, its held-out accuracy, save and load; then a second fit into the same model_dir
    resumes from its latest checkpoint, and exports a plain Keras file. The model_dir is a URL
    (pyarrow's file://) to a folder that does not exist yet: the first fit makes it."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy

    from hvd_magic.spark import KerasEstimator, KerasModel

    train_df, test_df = mnist

    def estimator(epochs):
        keras.utils.set_random_seed(0)
        net = keras.Sequential(
            [keras.Input((784,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)]
        )
        return KerasEstimator(
            num_proc=2,
            model=net,
            optimizer=keras.optimizers.Adam(2e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[
                "accuracy",
                "acc",
                "sparse_categorical_accuracy",
                keras.metrics.SparseCategoricalAccuracy(name="sca"),
            ],
            feature_cols=["image"],
            label_cols=["label"],
            batch_size=32,
            epochs=epochs,
            validation=0.1,
            model_dir=f"file://{tmp_path}/run",
        )

    # 8,320 rows: 4,160 a rank, 416 of them held out, 3,744 = 117 whole batches of 32 (a last,
    # partial batch would make Keras trace its step a second time on every rank)
    model = estimator(2).fit(train_df.limit(8320))
    assert "epoch 1: " in capsys.readouterr().out  # rank 0's line for each epoch it trains
    assert len(model.history) == 2 and model.history[1]["val_accuracy"] > 0.85
    for epoch in model.history:  # a Keras metric name and a Metric object agree with 'accuracy'
        assert epoch["val_sparse_categorical_accuracy"] == pytest.approx(epoch["val_accuracy"], abs=1e-6)
        assert epoch["val_sca"] == pytest.approx(epoch["val_accuracy"], abs=1e-6)
        assert epoch["val_acc"] == epoch["val_accuracy"]  # Keras' short name, kept as given
    predicted = model.transform(test_df)
    assert accuracy(predicted) >= 0.9
    model.save(str(tmp_path / "saved"))
    loaded = KerasModel.load(str(tmp_path / "saved"))
    assert loaded.getModel().output_shape == (None, 10)  # the Keras model, as horovod.spark's getModel()
    before = predicted.select("rawPrediction").toPandas()["rawPrediction"].tolist()
    after = loaded.transform(test_df).select("rawPrediction").toPandas()["rawPrediction"].tolist()
    assert [list(row) for row in after] == [list(row) for row in before]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == [checkpoint_name(1), checkpoint_name(2)]
    # A second fit with one epoch more, into the same model_dir: only epoch 3 is trained.
    resumed = estimator(3).fit(train_df.limit(1920))  # 864 rows a rank to train: 27 batches
    trained = capsys.readouterr().out
    assert "epoch 3: " in trained and "epoch 1: " not in trained and "epoch 2: " not in trained
    assert len(resumed.history) == 3 and resumed.history[:2] == model.history
    checkpoints = [checkpoint_name(1), checkpoint_name(2), checkpoint_name(3)]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == checkpoints  # the new one kept there
    # The export in model_dir loads with plain Keras, outside Spark, to the same numbers.
    plain = keras.saving.load_model(str(tmp_path / "run" / "model" / "model.keras"), compile=False)
    images = numpy.stack(test_df.limit(50).toPandas()["image"].to_numpy()).astype("float32")
    numpy.testing.assert_allclose(
        plain.predict(images, verbose=0), resumed.getModel().predict(images, verbose=0)
    )
    assert run_processes_anywhere() == []


def test_a_users_own_estimator_subclass_fits_transforms_saves_and_loads(spark, tmp_path):
    """The generic base with a training loop of the user's own: least squares, solved from
    the ranks' summed normal equations, equals numpy's solution on all the rows."""
    import functools

    import numpy
    import pandas as pd
    from sklearn.datasets import load_digits

    from hvd_magic.spark import HorovodEstimator, HorovodModel

    def solve(spec):
        import horovod.torch as hvd
        import torch

        from hvd_magic.spark.training import load_rows

        hvd.init()
        rows = load_rows(spec)
        x = numpy.hstack([rows.x, numpy.ones((len(rows.x), 1))])
        y = numpy.eye(10)[rows.y]
        gram = hvd.allreduce(torch.from_numpy(x.T @ x), op=hvd.Sum, name="gram").numpy()
        moment = hvd.allreduce(torch.from_numpy(x.T @ y), op=hvd.Sum, name="moment").numpy()
        coef = numpy.linalg.solve(gram + 1e-3 * numpy.eye(len(gram)), moment)
        return {"coef": coef, "width": rows.x.shape[1]}

    def predictor(coef):
        return lambda inputs: numpy.hstack([inputs, numpy.ones((len(inputs), 1))]) @ coef

    class LeastSquaresModel(HorovodModel):
        coef = None

        def make_predict_fn(self):
            return functools.partial(predictor, self.coef)

        def save_artifacts(self, folder):
            numpy.save(os.path.join(folder, "coef.npy"), self.coef)

        def load_artifacts(self, folder):
            self.coef = numpy.load(os.path.join(folder, "coef.npy"))

    class LeastSquares(HorovodEstimator):
        def train_function(self):
            return solve

        def train_spec(self):
            return self.common_spec(None, None, None)

        def make_model(self, result, feature_width):
            model = LeastSquaresModel(feature_width=feature_width)
            model.coef = result["coef"]
            return model

    digits = load_digits()
    images, labels = digits.data[:1796] / 16.0, digits.target[:1796]  # 898 rows a rank, none dropped
    df = spark.createDataFrame(pd.DataFrame({"features": list(images), "label": labels}))
    model = LeastSquares(num_proc=2, feature_cols=["features"], label_cols=["label"]).fit(df)
    x = numpy.hstack([images, numpy.ones((len(images), 1))])
    expected = numpy.linalg.solve(x.T @ x + 1e-3 * numpy.eye(65), x.T @ numpy.eye(10)[labels])
    numpy.testing.assert_allclose(model.coef, expected, rtol=1e-6, atol=1e-8)
    assert model.feature_width == 64
    scored = model.transform(df).toPandas()
    raw = numpy.stack(scored["rawPrediction"].to_numpy())
    numpy.testing.assert_allclose(raw, (x @ expected).astype(numpy.float32), rtol=1e-4, atol=1e-4)
    assert (scored["prediction"].to_numpy() == raw.argmax(axis=1)).all()
    model.save(str(tmp_path / "saved"))
    loaded = LeastSquaresModel.load(str(tmp_path / "saved"))
    numpy.testing.assert_array_equal(loaded.coef, model.coef)
    assert run_processes_anywhere() == []


def test_accuracy_is_the_largest_output_or_a_probability_of_at_least_half():
    from hvd_magic.spark.training import accuracy

    assert accuracy([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], [1, 0, 0]) == pytest.approx(2 / 3)
    assert accuracy([[0.7], [0.2], [0.5], [0.49]], [1, 0, 1, 1]) == 0.75  # one output: >= 0.5 is class 1


def test_a_keras_metric_keras_does_not_know_is_refused_before_launch(mnist):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    from hvd_magic.spark import KerasEstimator

    train_df, _ = mnist
    net = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
    estimator = KerasEstimator(
        num_proc=2, model=net, optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy",
        metrics=["accuracy", "precisionish"], feature_cols=["image"], label_cols=["label"], validation=0.1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="Keras has no metric named 'precisionish'"):
        estimator.fit(train_df)
    assert run_processes_anywhere() == []


def test_keras_callbacks_and_a_models_own_classes_and_functions_reach_the_ranks(mnist, tmp_path):
    """One Keras fit for both. Callbacks get Keras' lifecycle: LearningRateScheduler reaches the
    optimizer that trains (a rate of 0 leaves the weights as the first epoch's checkpoint has
    them); a callback sees every batch; a stop asked on rank 0 alone ends the fit after that
    epoch on both ranks (else rank 1 would wait forever). What the notebook defines is not
    importable on the ranks or the executors: a layer class travels with the model on its own,
    as does a function registered with Keras in the notebook (its __main__); a function the file
    names that is neither must be given as custom_objects, and without it the model is refused
    before launch, saying what to give. The model has all three: refused without
    custom_objects, then fitted, transformed, saved and loaded with it."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import cloudpickle
    import keras
    import numpy

    from hvd_magic.spark import KerasEstimator, KerasModel

    class Lifecycle(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.began, self.batches = 1.0, 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1 if logs and "loss" in logs else 0

        def on_epoch_end(self, epoch, logs=None):
            import horovod.tensorflow as hvd

            logs.update(batches=self.batches, began=self.began)
            self.batches = 0
            if epoch == 1 and hvd.rank() == 0:
                self.model.stop_training = True

    class Scale(keras.layers.Layer):
        def __init__(self, factor=1.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def call(self, x):
            return x * self.factor

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

    def scaled(x):  # given as custom_objects
        return x * 0.5

    def halved(x):  # registered with Keras in the notebook
        return x * 0.5

    train_df, test_df = mnist
    keras.utils.set_random_seed(0)
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.01 if epoch == 0 else 0.0)
    params = dict(
        num_proc=2, optimizer=keras.optimizers.Adam(0.5), feature_cols=["image"], label_cols=["label"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), batch_size=50, epochs=5,
        verbose=0, callbacks=[schedule, Lifecycle()], model_dir=str(tmp_path / "run"),
    )  # fmt: skip
    halved.__module__ = "__main__"
    keras.saving.register_keras_serializable(package="notebook")(halved)
    try:
        own = keras.Sequential(
            [
                keras.Input((784,)),
                Scale(2.0),
                keras.layers.Activation(scaled),
                keras.layers.Activation(halved),
                keras.layers.Dense(10),
            ]
        )
        with pytest.raises(ValueError, match=r"does not load back .* custom_objects=\{'name': object\}"):
            KerasEstimator(model=own, **params).fit(train_df)
        assert run_processes_anywhere() == []
        model = KerasEstimator(model=own, custom_objects={"scaled": scaled}, **params).fit(
            train_df.limit(2000)
        )
        assert [epoch["batches"] for epoch in model.history] == [20, 20]  # 1,000 rows a rank, 50 a batch
        assert [epoch["began"] for epoch in model.history] == [1.0, 1.0]
        assert [epoch["learning_rate"] for epoch in model.history] == pytest.approx([0.01, 0.0])
        checkpoints = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
        assert checkpoints == [checkpoint_name(1), checkpoint_name(2)]
        first = cloudpickle.loads((tmp_path / "run" / "checkpoints" / checkpoints[0]).read_bytes())["weights"]
        for after, before in zip(model.getModel().get_weights(), first, strict=True):
            numpy.testing.assert_array_equal(after, before)  # epoch 2 trained at rate 0
        assert isinstance(model.getModel().layers[0], Scale) and model.getModel().layers[0].factor == 2.0
        before = model.transform(test_df.limit(200)).select("rawPrediction").toPandas()["rawPrediction"]
        model.save(str(tmp_path / "saved"))
        loaded = KerasModel.load(str(tmp_path / "saved"))
        after = loaded.transform(test_df.limit(200)).select("rawPrediction").toPandas()["rawPrediction"]
        assert [list(row) for row in after] == [list(row) for row in before]
    finally:
        keras.saving.get_custom_objects().pop("notebook>halved")
    assert run_processes_anywhere() == []
