"""``checkpoint_dir=`` and ``logdir=``: where a run keeps its files, a folder of this machine or
(checkpoints) an fsspec URL whose file system is installed here, checked before anything starts."""

from __future__ import annotations

import os
import re

from hvd_magic.options.extras import tensorboard_record_writer
from hvd_magic.options.parse import OptionError

__all__ = ["COMMON_SCHEMES", "full_location", "parse_checkpoint_dir", "parse_logdir"]

# file:/x: a scheme of 2 letters or more (not C:/), then one slash
_SHORT_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(/(?!/).*)$")


def full_location(text: str) -> str:
    """A place for files, as hvd_magic reads it: a URL with one slash (as Spark writes them;
    they were taken for relative folders) in its full form (``hdfs:/x`` -> ``hdfs:///x``),
    ``file:/x`` as the path ``/x``, Databricks' ``dbfs:/x`` as its mount ``/dbfs/x``; else as it is."""
    found = _SHORT_URL.match(text)
    if found is None:
        return text
    scheme, path = found[1].lower(), found[2]
    return {"dbfs": f"/dbfs{path}", "file": path}.get(scheme, f"{found[1]}://{path}")


def parse_checkpoint_dir(value: str | None) -> str | None:
    if not value:
        return None
    value = full_location(value)
    if "://" in value:
        return _file_system_url("checkpoint_dir", value)
    folder = os.path.abspath(os.path.expanduser(value))
    parent = os.path.dirname(folder)
    if not os.path.isdir(folder) and not os.path.isdir(parent):
        raise OptionError(f"checkpoint_dir={value}: neither it nor its folder {parent} exists; make it first")
    return folder


# The schemes named in the error for an unknown one, and the package that adds each.
COMMON_SCHEMES = {"s3": "s3fs", "gs": "gcsfs", "abfs": "adlfs", "hdfs": "pyarrow", "file": "", "memory": ""}


def _file_system_url(option: str, value: str) -> str:
    """An fsspec URL whose file system is known and installed here (the notebook opens it)."""
    scheme = value.split("://", 1)[0]
    common = ", ".join(f"{s}:// ({p})" if p else f"{s}://" for s, p in COMMON_SCHEMES.items())
    try:
        import fsspec
    except ImportError:
        raise OptionError(
            f"{option}={value} is a URL, which needs fsspec: pip install fsspec (and the package of "
            f"its file system: {common}), or give a folder of this machine"
        ) from None
    if scheme not in fsspec.available_protocols():
        raise OptionError(
            f"{option}={value}: no file system is known for '{scheme}://'. Known here: {common} and "
            "the other schemes fsspec lists (fsspec.available_protocols()); a package adds its own "
            "(the one in brackets), or give a folder of this machine"
        )
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as err:
        package = COMMON_SCHEMES.get(scheme)
        hint = f"pip install {package}" if package else str(err)
        raise OptionError(f"{option}={value}: its {scheme}:// file system is not installed: {hint}") from None
    return value


def parse_logdir(value: str | None) -> str | None:
    """A folder for TensorBoard event files (made if missing); refused without tensorboard."""
    if not value:
        return None
    value = full_location(value)
    if "://" in value:
        raise OptionError(f"logdir={value}: give a folder of this machine (or a mount: /dbfs/...), not a URL")
    folder = os.path.abspath(os.path.expanduser(value))
    try:
        tensorboard_record_writer()
        os.makedirs(folder, exist_ok=True)
    except (ImportError, OSError) as err:
        raise OptionError(f"logdir={value}: {err}") from None
    return folder
