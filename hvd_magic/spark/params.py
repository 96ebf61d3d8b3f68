"""The Params of the estimators and their models, named as horovod.spark names them (``num_proc``,
``feature_cols``, ``batch_size`` ...) with ``getX``/``setX`` accessors, so that moving from
horovod.spark means changing the import."""

from __future__ import annotations

from typing import Any, TypeVar

from pyspark.ml.param import Param, Params, TypeConverters

__all__ = ["EstimatorParams", "ModelParams", "accessors"]

P = TypeVar("P", bound=type[Params])


def _param(name: str, doc: str, converter: Any = None) -> Param[Any]:
    return Param(Params._dummy(), name, doc, typeConverter=converter or TypeConverters.identity)


def _share(value: Any) -> float:
    """``validation``: a share of the rows (horovod.spark also took a column's name)."""
    if isinstance(value, str):
        raise TypeError(
            f"validation={value!r}: hvd_magic holds out a share of each rank's rows (e.g. "
            "validation=0.1); a column marking validation rows is not supported. Drop those rows "
            "from the DataFrame given to fit, and evaluate on them with model.transform."
        )
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

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            output_cols=["rawPrediction"], prediction_col="prediction", batch_size=32, label_cols=[]
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
    validation = _param("validation", "share of each rank's rows held out for validation (0 to < 1)", _share)
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

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            metrics=[],
            callbacks=[],
            custom_objects={},
            epochs=1,
            validation=0.0,
            verbose=1,
            random_seed=0,
            shuffle=True,
        )
