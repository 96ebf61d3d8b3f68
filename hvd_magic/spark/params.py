"""The Params of the estimators and their models, named as horovod.spark names them (``num_proc``,
``feature_cols``, ``batch_size`` ...) with ``getX``/``setX`` accessors, so that moving from
horovod.spark means changing the import."""

from __future__ import annotations

from typing import Any, TypeVar

from pyspark.ml.param import Param, Params, TypeConverters

from hvd_magic.options.table import ESTIMATOR_RETRIES

__all__ = ["DEFAULT_RETRIES", "EstimatorParams", "ModelParams", "accessors"]

# The Params a run's options share (num_proc, launcher, retries, min_np, resize_wait) keep to
# their entries in hvd_magic.options.OPTIONS: tests/test_options_table.py holds their types and
# defaults to them.
DEFAULT_RETRIES = ESTIMATOR_RETRIES

P = TypeVar("P", bound=type[Params])


def _param(name: str, doc: str, converter: Any = None) -> Param[Any]:
    return Param(Params._dummy(), name, doc, typeConverter=converter or TypeConverters.identity)


def _share(value: Any) -> float | str:
    """``validation``: a share of the rows, or (as in horovod.spark) the name of a column whose
    true (or 1) rows are the validation rows."""
    if isinstance(value, str):
        if not value:
            raise ValueError("validation='': give a share of the rows (e.g. 0.1) or a column's name")
        return value
    share = TypeConverters.toFloat(value)
    if not 0 <= share < 1:
        raise ValueError(f"validation={value!r}: give a share of the rows from 0 up to (not including) 1")
    return share


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def accessors(cls: P) -> P:
    """Add ``getNumProc()`` / ``setNumProc(value)`` ... for every Param the class declares."""
    for name, value in list(vars(cls).items()):
        if isinstance(value, Param):

            def get(self: Params, _name: str = name) -> Any:
                return self.getOrDefault(self.getParam(_name))

            def set_(self: Params, value: Any, _name: str = name) -> Params:
                return self._set(**{_name: value})

            setattr(cls, f"get{_camel(name)}", get)
            setattr(cls, f"set{_camel(name)}", set_)
    return cls


@accessors
class ModelParams(Params):
    """What a fitted model needs to transform a DataFrame."""

    feature_cols = _param(
        "feature_cols", "feature columns, in the model's input order", TypeConverters.toListString
    )
    label_cols = _param("label_cols", "label columns the model was trained on", TypeConverters.toListString)
    output_cols = _param("output_cols", "column(s) for the model's raw output", TypeConverters.toListString)
    prediction_col = _param(
        "prediction_col",
        "column for the prediction: argmax of a vector output, else the output",
        TypeConverters.toString,
    )
    batch_size = _param("batch_size", "rows per batch (training and inference)", TypeConverters.toInt)
    input_shapes = _param(
        "input_shapes",
        "shape of each model input, batch first (e.g. [[-1, 1, 28, 28]]): one shape for all the "
        "feature columns, or one per column (the model then takes one argument per column)",
    )
    run_id = _param("run_id", "the run's name: its folder under store= (default: framework_time)")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            output_cols=["rawPrediction"],
            prediction_col="prediction",
            batch_size=32,
            label_cols=[],
            input_shapes=None,
            run_id=None,
        )


@accessors
class EstimatorParams(ModelParams):
    """What training needs; the model, optimizer and loss are objects of the framework."""

    num_proc = _param(
        "num_proc", "Horovod ranks: N on the Spark cluster, -N on this machine", TypeConverters.toInt
    )
    model = _param("model", "the model to train (its weights are the starting point)")
    optimizer = _param("optimizer", "the optimizer (its class and settings are used on every rank)")
    loss = _param("loss", "the loss function")
    metrics = _param(
        "metrics",
        "metrics computed on the validation rows each epoch: 'accuracy', functions (torch: of output "
        "and target; Keras: of target and output), Keras metric names and objects",
    )
    callbacks = _param(
        "callbacks", "Keras callbacks (KerasEstimator): called as Keras' fit calls them, on every rank"
    )
    custom_objects = _param(
        "custom_objects",
        "Keras: {name: class or function} the model's file needs to load (its own layer classes "
        "are found without it)",
    )
    epochs = _param("epochs", "passes over the data", TypeConverters.toInt)
    validation = _param(
        "validation",
        "share of each rank's rows held out for validation (0 to < 1), or a boolean column marking "
        "the validation rows",
        _share,
    )
    verbose = _param("verbose", "0: quiet; 1: one line per epoch on rank 0", TypeConverters.toInt)
    model_dir = _param(
        "model_dir",
        "folder for checkpoints and the exported model (resumes from it)",
        TypeConverters.toString,
    )
    random_seed = _param(
        "random_seed", "seed of the initial shuffle and of each epoch's order", TypeConverters.toInt
    )
    launcher = _param("launcher", "mpi or gloo (default: mpi when mpirun exists)", TypeConverters.toString)
    shuffle = _param("shuffle", "shuffle each rank's rows every epoch", TypeConverters.toBoolean)
    backend = _param(
        "backend", "horovod.spark's Backend (e.g. SparkBackend(num_proc=4)): its num_proc is used"
    )
    store = _param(
        "store",
        "horovod.spark's Store (Store.create(path)), or a path or URL: checkpoints, callbacks' files and "
        "the model go to its run folder (prefix/runs/run_id)",
    )
    val_batch_size = _param(
        "val_batch_size", "rows per validation batch (default: batch_size)", TypeConverters.toInt
    )
    train_steps_per_epoch = _param(
        "train_steps_per_epoch",
        "batches per epoch on each rank (default: the rows over batch_size and ranks; a rank with "
        "fewer rows goes round its rows again)",
        TypeConverters.toInt,
    )
    validation_steps_per_epoch = _param(
        "validation_steps_per_epoch",
        "validation batches per epoch on each rank (default: all)",
        TypeConverters.toInt,
    )
    backward_passes_per_step = _param(
        "backward_passes_per_step",
        "TorchEstimator: batches whose gradients add up locally before one allreduce and step",
        TypeConverters.toInt,
    )
    gradient_compression = _param(
        "gradient_compression",
        "Horovod's compression of the allreduced gradients (e.g. hvd.Compression.fp16)",
    )
    inmemory_cache_all = _param(
        "inmemory_cache_all",
        "kept for horovod.spark: each rank always holds its rows in memory",
        TypeConverters.toBoolean,
    )
    use_gpu = _param(
        "use_gpu", "False: KerasEstimator's ranks hide their GPU from TensorFlow", TypeConverters.toBoolean
    )
    retries = _param(
        "retries",
        "hvd_magic's own (horovod.spark has none): times a fit that lost a rank's process or its "
        "executor (not to an exception of its code) starts again, from the last epoch's checkpoint "
        f"(default {DEFAULT_RETRIES})",
        TypeConverters.toInt,
    )
    min_np = _param(
        "min_np",
        "hvd_magic's own: after a loss, go on with at least this many ranks from the last epoch's "
        "checkpoint instead of waiting for num_proc slots; back to num_proc at a later epoch once they "
        "return (default: never fewer)",
        TypeConverters.toInt,
    )
    resize_wait = _param(
        "resize_wait",
        "hvd_magic's own: with min_np, the seconds to wait for num_proc slots after a loss before going "
        "on with fewer (default 30)",
        TypeConverters.toFloat,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            backend=None,
            store=None,
            val_batch_size=None,
            train_steps_per_epoch=None,
            validation_steps_per_epoch=None,
            gradient_compression=None,
            backward_passes_per_step=1,
            inmemory_cache_all=False,
            use_gpu=True,
            retries=DEFAULT_RETRIES,
            min_np=None,
            resize_wait=None,
            metrics=[],
            callbacks=[],
            custom_objects={},
            epochs=1,
            validation=0.0,
            verbose=1,
            random_seed=0,
            shuffle=True,
        )
