"""An unfitted estimator in a folder, so that a ``Pipeline`` holding one saves and loads before
``fit`` (as horovod.spark's estimators did): ``metadata/part-00000`` in Spark ML's format with
the Params JSON can hold, and ``params.pkl`` (cloudpickle) with the rest: the model, optimizer,
loss, metrics, callbacks. Like horovod.spark, ``backend`` and ``store`` are not saved: they
describe this session's cluster and storage; set them again after loading."""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

import cloudpickle
from pyspark.ml.util import MLReader, MLWriter

from hvd_magic.options.folders import full_location
from hvd_magic.spark.persistence import local_folder, open_location

__all__ = ["EstimatorReader", "EstimatorWriter"]

_OBJECTS = "params.pkl"
_NOT_SAVED = ("backend", "store")


def _json_or_none(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class EstimatorWriter(MLWriter):
    def __init__(self, estimator: Any) -> None:
        super().__init__()
        self.estimator = estimator

    def save(self, path: str) -> None:
        path = full_location(path)
        if "://" in path:
            from pyarrow import fs

            remote, inside = open_location(path)
            if remote.get_file_info(inside).type != fs.FileType.NotFound:
                if not self.shouldOverwrite:
                    raise FileExistsError(f"{path} already exists: use .write().overwrite().save(path)")
                remote.delete_dir(inside)
            with local_folder(path, download=False) as folder:
                assert folder is not None
                _save_here(self.estimator, folder)
            return
        if os.path.exists(path):
            if not self.shouldOverwrite:
                raise FileExistsError(f"{path} already exists: use .write().overwrite().save(path)")
            shutil.rmtree(path)
        _save_here(self.estimator, path)


def _save_here(estimator: Any, path: str) -> None:
    import pyspark

    plain: dict[str, Any] = {}
    objects: dict[str, Any] = {}
    for param, value in estimator._paramMap.items():
        if param.name in _NOT_SAVED:
            continue
        (plain if _json_or_none(value) else objects)[param.name] = value
    metadata = {
        "class": f"{type(estimator).__module__}.{type(estimator).__qualname__}",
        "timestamp": int(time.time() * 1000),
        "sparkVersion": pyspark.__version__,
        "uid": estimator.uid,
        "paramMap": plain,
        "defaultParamMap": {p.name: v for p, v in estimator._defaultParamMap.items() if _json_or_none(v)},
    }
    try:
        blob = cloudpickle.dumps(objects)
    except Exception as err:  # noqa: BLE001 - whatever a parameter holds that cannot be pickled
        raise ValueError(
            f"{type(estimator).__name__} cannot be saved: one of {', '.join(sorted(objects))} cannot be "
            f"pickled ({type(err).__name__}: {err}); save it without that parameter and set it after loading"
        ) from None
    os.makedirs(os.path.join(path, "metadata"))
    with open(os.path.join(path, "metadata", "part-00000"), "w") as out:
        out.write(json.dumps(metadata) + "\n")
    with open(os.path.join(path, _OBJECTS), "wb") as out:
        out.write(blob)


class EstimatorReader(MLReader[Any]):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        with local_folder(path, upload=False) as folder:
            assert folder is not None
            if not os.path.exists(os.path.join(folder, _OBJECTS)):
                raise FileNotFoundError(f"{path} is not a saved hvd_magic estimator (no {_OBJECTS} in it)")
            with open(os.path.join(folder, "metadata", "part-00000")) as metadata_file:
                metadata = json.loads(metadata_file.readline())
            with open(os.path.join(folder, _OBJECTS), "rb") as blob:
                objects = cloudpickle.load(blob)
        estimator = self.cls()
        estimator._resetUid(metadata["uid"])
        estimator._set(**metadata["paramMap"], **objects)
        return estimator
