"""horovod.spark's estimator arguments that have no counterpart here (they tune Petastorm readers,
intermediate Parquet files, NVTabular ...): accepted, kept as Params with horovod.spark's
accessors, and each named in a one-line note per fit when given a value other than
horovod.spark's default, so that code written for horovod.spark runs with the import changed."""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params

from hvd_magic.spark.params import accessors

__all__ = ["UNUSED", "UnusedParams", "legacy_accessors", "unused_notes"]

# name: (horovod.spark 0.28.1's default, why it does nothing here)
UNUSED: dict[str, tuple[Any, str]] = {
    "data_module": (None, "each rank reads its shard straight from Spark (no Petastorm or NVTabular module)"),
    "loss_weights": (None, "the estimators train one output, so there are no losses to weigh"),
    "sample_weight_col": (None, "rows are not weighted (repeat rows to give them more weight)"),
    "continuous_cols": (None, "NVTabular's columns: name the model's inputs in feature_cols"),
    "categorical_cols": (None, "NVTabular's columns: name the model's inputs in feature_cols"),
    "shuffle_buffer_size": (
        None,
        "deprecated in horovod.spark: shuffle=True reshuffles all of a rank's rows",
    ),
    "partitions_per_process": (10, "no intermediate Parquet files are written"),
    "transformation_fn": (None, "transform the DataFrame before fit (e.g. with a pandas UDF)"),
    "transformation_edit_fields": (None, "Petastorm's TransformSpec: transform the DataFrame before fit"),
    "transformation_removed_fields": (None, "Petastorm's TransformSpec: select the columns before fit"),
    "train_reader_num_workers": (2, "no Petastorm readers: each rank holds its rows in memory"),
    "val_reader_num_workers": (2, "no Petastorm readers: each rank holds its rows in memory"),
    "reader_pool_type": ("thread", "no Petastorm readers: each rank holds its rows in memory"),
    "label_shapes": (None, "labels reach the loss as one number a row, or a vector for vector labels"),
    "mp_start_method": (None, "the ranks start no reader processes"),
    "compress_sparse_cols": (False, "sparse vectors reach the ranks as dense arrays"),
}


def _declare(cls: type[Params]) -> type[Params]:
    for name, (_, why) in UNUSED.items():
        setattr(cls, name, Param(Params._dummy(), name, f"kept for horovod.spark, not used: {why}"))
    return cls


@accessors
@_declare
class UnusedParams(Params):
    def __init__(self) -> None:
        super().__init__()
        self._setDefault(**{name: default for name, (default, _) in UNUSED.items()})


# horovod.spark's accessor names where they differ from the Param's name in CamelCase
_LEGACY = {
    "ShufflingBufferSize": "shuffle_buffer_size",
    "TrainReaderNumWorker": "train_reader_num_workers",
    "ValReaderNumWorker": "val_reader_num_workers",
    "InMemoryCacheAll": "inmemory_cache_all",
}


def legacy_accessors(cls: type[Params]) -> type[Params]:
    """``getShufflingBufferSize`` ... as horovod.spark spells them, beside ours."""
    for suffix, name in _LEGACY.items():
        setattr(cls, f"get{suffix}", getattr(cls, f"get{''.join(p.title() for p in name.split('_'))}"))
        setattr(cls, f"set{suffix}", getattr(cls, f"set{''.join(p.title() for p in name.split('_'))}"))
    return cls


def unused_notes(estimator: Params, unused: dict[str, tuple[Any, str]]) -> list[str]:
    """One line for each argument in ``unused`` given a value other than horovod.spark's default."""
    notes = []
    for name, (default, why) in unused.items():
        if estimator.hasParam(name) and estimator.isSet(name):
            value = estimator.getOrDefault(name)
            if value is not None and value != default:
                notes.append(f"{type(estimator).__name__}: {name}= is not used here: {why}.")
    return notes
