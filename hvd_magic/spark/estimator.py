"""The generic estimator and model: ``fit(df)`` is one Horovod run with ``data=df`` (through the
same supervision and launchers as ``%%horovod``, live view included); the fitted model transforms
with ``predict_batch_udf`` on the executors and saves to a folder any Spark ML reader finds.

A framework subclass says how to train on a rank (``train_function``, ``train_spec``), how to
build its model from rank 0's result (``make_model``) and how that model predicts, saves and
loads (``HorovodModel`` hooks).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pyspark.ml import Estimator, Model
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from hvd_magic.options import OptionError, make_options
from hvd_magic.run.packing import pack_function
from hvd_magic.run.supervisor import run_on_ranks
from hvd_magic.spark import callback_files, compat, estimator_io, fit_records, persistence
from hvd_magic.spark.columns import check_columns, features_column, prediction_column
from hvd_magic.spark.compat_params import UNUSED, UnusedParams, legacy_accessors, unused_notes
from hvd_magic.spark.params import EstimatorParams, ModelParams
from hvd_magic.spark.training import TrainSpec, is_accuracy

__all__ = ["HorovodEstimator", "HorovodModel"]

CHECKPOINTS = "checkpoints"
EXPORT = "model"


class HorovodModel(Model, ModelParams, MLWritable, MLReadable["HorovodModel"]):
    """A fitted model: ``transform`` adds ``output_cols[0]`` (default ``rawPrediction``: the raw
    output, array<float>) and
    ``prediction_col``; ``history`` holds the per-epoch metrics averaged over the ranks."""

    def __init__(self, history: list[dict[str, float]] | None = None, feature_width: int = 0) -> None:
        super().__init__()
        self.history = history or []
        self.feature_width = feature_width

    # --- framework hooks ---------------------------------------------------------------------
    def make_predict_fn(self) -> Callable[[], Callable[[Any], Any]]:
        raise NotImplementedError

    def save_artifacts(self, folder: str) -> None:
        raise NotImplementedError

    def load_artifacts(self, folder: str) -> None:
        raise NotImplementedError

    # --- Spark ML ----------------------------------------------------------------------------
    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.functions import predict_batch_udf
        from pyspark.sql.types import ArrayType, FloatType

        predict = predict_batch_udf(
            self.make_predict_fn(),
            return_type=ArrayType(FloatType()),
            batch_size=self.getOrDefault("batch_size"),
            input_tensor_shapes=[[self.feature_width]] if self.feature_width else None,
        )
        check_columns(dataset, self.getOrDefault("feature_cols"), None)  # a DataError naming the column
        output = self.getOrDefault("output_cols")[0]
        with_output = dataset.withColumn(
            output, predict(features_column(dataset, self.getOrDefault("feature_cols")))
        )
        return with_output.withColumn(
            self.getOrDefault("prediction_col"), prediction_column(with_output[output])
        )

    def write(self) -> MLWriter:
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader[HorovodModel]:
        return _ModelReader(cls)


class _ModelWriter(MLWriter):
    def __init__(self, model: HorovodModel) -> None:
        super().__init__()
        self.model = model

    def save(self, path: str) -> None:
        persistence.save(self.model, path, overwrite=self.shouldOverwrite)


class _ModelReader(MLReader[HorovodModel]):
    def __init__(self, cls: type[HorovodModel]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> HorovodModel:
        return persistence.load(self.cls, path)


@legacy_accessors
class HorovodEstimator(Estimator[HorovodModel], EstimatorParams, UnusedParams, MLWritable, MLReadable[Any]):
    """``fit(df)`` trains on ``num_proc`` Horovod ranks, each with its equal shard of
    ``df[feature_cols + label_cols]``, and returns the fitted model. With ``model_dir`` (or
    horovod.spark's ``store``: its run folder), rank 0 sends a checkpoint each epoch into
    ``model_dir/checkpoints`` (no shared file system needed; the last 3 kept), a new fit resumes
    from the latest one, the files callbacks write arrive in ``model_dir``, and the exported
    model lands in ``model_dir/model``. ``model_dir`` is a local folder or a URL (pyarrow's file
    systems, else fsspec's: ``s3://``, ``gs://``, ``hdfs://``, ``file://``, ``memory://`` ...).
    A fit that loses a rank's process or its executor starts again on its own, from the last
    epoch's checkpoint, up to ``retries`` times (default 2; an exception of the model's or the
    loss's code is never retried). Every argument of horovod.spark's estimators is taken; those
    with no use here are named in a note when the fit starts.
    """

    framework = "horovod"  # the start of a run_id horovod.spark would make (pytorch_..., keras_...)
    calls_callbacks = False  # whether the ranks call ``callbacks`` (Keras' do)
    unused_here: dict[str, tuple[Any, str]] = UNUSED  # arguments with no use here: (default, why)

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self.setParams(**params)

    def setParams(self, **params: Any) -> HorovodEstimator:  # noqa: N802 - Spark's name
        """Set several parameters at once, by name (as horovod.spark's ``setParams``)."""
        unknown = sorted(name for name in params if not self.hasParam(name))
        if unknown:
            known = ", ".join(sorted(p.name for p in self.params))
            raise TypeError(f"{type(self).__name__} has no parameter {', '.join(unknown)}; it has: {known}")
        return self._set(**{name: value for name, value in params.items() if value is not None})

    # --- framework hooks (a subclass with its own training loop gives these) ------------------
    def train_function(self) -> Callable[[TrainSpec], Any]:
        """The function every rank runs with the ``TrainSpec``: ``hvd.init()``, then its rows
        from ``training.load_rows(spec)``. Rank 0's return value goes to ``make_model``; a dict
        with ``"width"`` (the rows' feature width) lets ``transform`` check its input's shape.
        To resume (a retry, or a new fit with ``model_dir``): ``hvd_magic.resume()`` first, and
        ``hvd_magic.checkpoint(state, step=epoch)`` each epoch when ``spec.save_checkpoints``."""
        raise NotImplementedError

    def train_spec(self) -> TrainSpec:
        """What the ranks get (``common_spec`` fills it from the Params)."""
        raise NotImplementedError

    def make_model(self, result: Any, feature_width: int) -> HorovodModel:
        """The fitted model, from rank 0's return value."""
        raise NotImplementedError

    def notes(self) -> list[str]:
        """Lines said once when a fit starts: horovod.spark arguments given that have no use here."""
        return compat.backend_notes(self) + unused_notes(self, self.unused_here)

    # --- Spark ML ----------------------------------------------------------------------------
    def _fit(self, dataset: Any) -> HorovodModel:
        validation = self.getOrDefault("validation")
        column = validation if isinstance(validation, str) else None
        features, labels = self.getOrDefault("feature_cols"), self.getOrDefault("label_cols")
        check_columns(dataset, features, labels, column)
        options = self._options(
            dataset.select(*dict.fromkeys([*features, *labels, *([column] if column else [])]))
        )
        where = compat.destination(self, self.framework)
        with persistence.local_folder(
            where.location, filesystem=where.filesystem
        ) as folder:  # a URL's, through a copy
            checkpoints = self._checkpoints_in(folder, options)
            fit_records.before_fit(self, options, folder)
            spec = self.train_spec()
            spec.save_checkpoints = checkpoints is not None or options.retries > 0
            spec.send_files = checkpoints is not None
            try:
                value, _ = run_on_ranks(pack_function(self.train_function(), {"spec": spec}), options)
            finally:
                if folder and checkpoints:
                    callback_files.place(checkpoints, folder)
            model = self._fitted(value, where.run_id)
            if folder:
                model.write().overwrite().save(os.path.join(folder, EXPORT))
            fit_records.after_fit(model, os.path.join(folder, EXPORT) if folder else None)
        return model

    def _checkpoints_in(self, folder: str | None, options: Any) -> str | None:
        """``model_dir/checkpoints``, made: the run's checkpoint store (a retry within this fit
        and a new fit resume from its latest), where the callbacks' files arrive too; None
        without a ``model_dir`` (retries then resume from a temporary store)."""
        if not folder:
            if self.calls_callbacks and callback_files.writes_files(self.getOrDefault("callbacks")):
                options.notices.append(
                    f"{type(self).__name__}: the callbacks' files stay where the ranks run; give "
                    "model_dir= (or store=) to have them here."
                )
            return None
        checkpoints = os.path.join(folder, CHECKPOINTS)
        os.makedirs(checkpoints, exist_ok=True)
        options.files_dir = options.checkpoint_dir = checkpoints
        return checkpoints

    def _options(self, data: Any) -> Any:
        try:
            options = make_options(
                np=compat.num_proc(self, data),
                launcher=self.getOrDefault("launcher") if self.isDefined("launcher") else None,
                env=compat.rank_env(self) or None,
                data=data,
                data_name="(the DataFrame given to fit)",
                retries=self.getOrDefault("retries"),
                min_np=self.getOrDefault("min_np"),
                resize_wait=self.getOrDefault("resize_wait"),
            )
        except OptionError as err:
            raise ValueError(f"{type(self).__name__}: {err}") from None
        options.notices += self.notes()
        options.checkpoint_unit = "epoch"  # a retry says "attempt 2 of 3 from epoch 4"
        return options

    def _fitted(self, value: Any, run_id: str | None) -> HorovodModel:
        width = value.get("width", 0) if isinstance(value, dict) else 0  # as the ranks saw it
        model = self.make_model(value, int(width))
        model._set(**{p.name: self.getOrDefault(p.name) for p in model.params if self.isDefined(p.name)})
        if run_id:
            model._set(run_id=run_id)
        return model

    def write(self) -> MLWriter:
        """An unfitted estimator saves too (a ``Pipeline`` holding it saves and loads before fit)."""
        return estimator_io.EstimatorWriter(self)

    @classmethod
    def read(cls) -> MLReader[Any]:
        return estimator_io.EstimatorReader(cls)

    def check_metric(self, metric: Any) -> Any:
        """A metric as the ranks take it; a ValueError for one they cannot compute."""
        if is_accuracy(metric) or (callable(metric) and not isinstance(metric, str)):
            return metric
        raise ValueError(
            f"{type(self).__name__}: metric {metric!r} is not one it computes: give 'accuracy' or a "
            "function of the outputs and labels that returns a number"
        )

    def require(self, *names: str) -> None:
        """A ValueError naming the parameters that have no value."""
        missing = [name for name in names if not self.isDefined(name)]
        if missing:
            raise ValueError(f"{type(self).__name__} needs {', '.join(f'{name}=' for name in missing)}")

    def common_spec(self, model: Any, optimizer: Any, loss: Any) -> TrainSpec:
        get = self.getOrDefault
        return TrainSpec(
            model=model,
            optimizer=optimizer,
            loss=loss,
            metrics=[self.check_metric(metric) for metric in get("metrics")],
            feature_cols=list(get("feature_cols")),
            label_cols=list(get("label_cols")),
            batch_size=get("batch_size"),
            epochs=get("epochs"),
            validation=get("validation"),
            seed=get("random_seed"),
            shuffle=get("shuffle"),
            verbose=get("verbose"),
            callbacks=list(get("callbacks")),
            val_batch_size=get("val_batch_size") or 0,
            train_steps=get("train_steps_per_epoch"),
            val_steps=get("validation_steps_per_epoch"),
            backward_passes=get("backward_passes_per_step"),
            compression=get("gradient_compression"),
            hide_gpus=not get("use_gpu"),
        )
