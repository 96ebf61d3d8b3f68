"""A fitted model in a folder.

The folder holds ``metadata/part-00000`` in Spark ML's own format (class, uid, params), so a
saved ``PipelineModel`` finds and loads the stage, ``hvd_magic.json`` (history, input width)
and the framework's files, which load outside Spark too (``state_dict.pt`` + ``module.pkl``
for PyTorch, ``model.keras`` for Keras). Written with plain file I/O: no SparkContext needed,
so it works from Spark Connect sessions as well."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any, TypeVar

from hvd_magic.options.folders import full_location

__all__ = ["load", "local_folder", "open_location", "save"]

M = TypeVar("M")  # a HorovodModel subclass (not imported here: the estimator imports this module)
_OWN = "hvd_magic.json"


def open_location(location: str, filesystem: Any = None) -> tuple[Any, str]:
    """A pyarrow file system and the path in it: ``filesystem`` (an fsspec one, e.g. a horovod
    Store's, with its storage options) if given, else pyarrow's own for the URI (s3://, gs://,
    hdfs://, file://), else fsspec's (any URL an installed fsspec implementation knows)."""
    from pyarrow import fs

    if filesystem is None:
        try:
            return fs.FileSystem.from_uri(location)  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - ArrowInvalid for a scheme pyarrow has no file system for
            import fsspec

            filesystem, path = fsspec.core.url_to_fs(location)
            return fs.PyFileSystem(fs.FSSpecHandler(filesystem)), path
    return fs.PyFileSystem(fs.FSSpecHandler(filesystem)), filesystem._strip_protocol(location)


@contextlib.contextmanager
def local_folder(
    location: str | None, download: bool = True, upload: bool = True, filesystem: Any = None
) -> Iterator[str | None]:
    """``location`` as a local folder: a path is itself; for a URL (``open_location``) a local
    copy, fetched first and sent back after, even when the block fails (the checkpoints a
    failed fit made are kept)."""
    location = full_location(location) if location else location
    if not location or ("://" not in location and filesystem is None):
        yield os.path.abspath(location) if location else None
        return
    from pyarrow import fs

    remote, path = open_location(location, filesystem)
    here, local = fs.LocalFileSystem(), tempfile.mkdtemp(prefix="hvd_magic-model_dir-")
    try:
        if download and remote.get_file_info(path).type == fs.FileType.Directory:
            fs.copy_files(path, local, source_filesystem=remote, destination_filesystem=here)
        yield local
    finally:
        if upload:
            remote.create_dir(path, recursive=True)
            fs.copy_files(local, path, source_filesystem=here, destination_filesystem=remote)
        shutil.rmtree(local, ignore_errors=True)


def save(model: Any, location: str, overwrite: bool = False) -> None:
    location = full_location(location)
    if "://" in location:
        from pyarrow import fs

        remote, path = open_location(location)
        if remote.get_file_info(path).type != fs.FileType.NotFound:
            if not overwrite:
                raise FileExistsError(f"{location} already exists: use model.write().overwrite().save(path)")
            remote.delete_dir(path)
        with local_folder(location, download=False) as folder:
            assert folder is not None
            _save_here(model, folder, overwrite=True)  # the empty local copy, sent on after
        return
    _save_here(model, location, overwrite)


def _save_here(model: Any, path: str, overwrite: bool = False) -> None:
    if os.path.exists(path):
        if not overwrite:
            raise FileExistsError(f"{path} already exists: use model.write().overwrite().save(path)")
        shutil.rmtree(path)
    os.makedirs(os.path.join(path, "metadata"))
    import pyspark

    metadata = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "timestamp": int(time.time() * 1000),
        "sparkVersion": pyspark.__version__,
        "uid": model.uid,
        "paramMap": {param.name: value for param, value in model._paramMap.items()},
        "defaultParamMap": {param.name: value for param, value in model._defaultParamMap.items()},
    }
    with open(os.path.join(path, "metadata", "part-00000"), "w") as out:
        out.write(json.dumps(metadata) + "\n")
    with open(os.path.join(path, _OWN), "w") as out:
        json.dump({"history": model.history, "feature_width": model.feature_width}, out)
    model.save_artifacts(path)


def load(cls: type[M], location: str) -> M:
    with local_folder(location, upload=False) as folder:
        assert folder is not None
        return _load_here(cls, folder)


def _load_here(cls: type[M], path: str) -> M:
    if not os.path.exists(os.path.join(path, _OWN)):
        raise FileNotFoundError(f"{path} is not a saved hvd_magic model (no {_OWN} in it)")
    with open(os.path.join(path, "metadata", "part-00000")) as metadata_file:
        metadata = json.loads(metadata_file.readline())
    with open(os.path.join(path, _OWN)) as own_file:
        own = json.load(own_file)
    model: Any = cls(history=own["history"], feature_width=own["feature_width"])  # type: ignore[call-arg]
    model._resetUid(metadata["uid"])
    model._set(**metadata["paramMap"])
    model.load_artifacts(path)
    return model  # type: ignore[no-any-return]
