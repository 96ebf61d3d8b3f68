"""Files that Keras callbacks write on the ranks (ModelCheckpoint, CSVLogger, TensorBoard ...),
brought to ``model_dir`` on the notebook's machine: the ranks may run on executors whose disks
the notebook never sees.

On a rank, ``RankFolder`` makes a folder of the rank's own its working directory, so relative
paths land there (and ranks do not write over each other's files); a callback's absolute path
stays as given on rank 0 and moves into the folder on the others. Rank 0 sends what changed
after each epoch with ``reporting.send_file`` under a flat name (the run writes files into
one folder); on the notebook's side ``place`` moves them to their relative path in
``model_dir`` (an absolute path's files go under its last folder's name, or by file name)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
import urllib.parse
from typing import Any

from hvd_magic.rank import reporting

__all__ = ["ENCODED", "RankFolder", "place", "writes_files"]

ENCODED = "callback-file~"
_FILE_ATTRIBUTES = ("filepath", "filename")  # ModelCheckpoint, CSVLogger: a file (maybe a pattern)
_FOLDER_ATTRIBUTES = ("log_dir", "backup_dir")  # TensorBoard, BackupAndRestore: a folder


def writes_files(callbacks: list[Any]) -> bool:
    """Whether any callback has a path it writes to (the kinds Keras' own callbacks have)."""
    return any(
        isinstance(getattr(callback, name, None), str)
        for callback in callbacks
        for name in (*_FILE_ATTRIBUTES, *_FOLDER_ATTRIBUTES)
    )


class RankFolder:
    """The rank's working directory while it trains (restored by ``close``); on rank 0 it
    sends what callbacks wrote and changed since the last ``send``."""

    def __init__(self, callbacks: list[Any], rank: int) -> None:
        self.rank = rank
        self.folder = tempfile.mkdtemp(prefix=f"hvd_magic-rank{rank}-files-")
        self.previous = os.getcwd()
        self.sent: dict[str, tuple[int, int]] = {}
        self.places: list[
            tuple[str, str]
        ] = []  # (glob pattern, name under model_dir: "" keeps the relative path)
        for callback in callbacks:
            self._place(callback)
        if rank == 0:  # what an absolute path held before this fit is not this fit's
            self.sent = {path: _version(path) for path, _ in self._files()}
        os.chdir(self.folder)

    def _place(self, callback: Any) -> None:
        for name in (*_FILE_ATTRIBUTES, *_FOLDER_ATTRIBUTES):
            path = getattr(callback, name, None)
            if not isinstance(path, str) or not os.path.isabs(path):
                continue
            base = os.path.basename(path.rstrip("/"))
            if self.rank != 0:  # the same path on one host: rank 0's file is the one kept
                setattr(callback, name, os.path.join(self.folder, base))
            elif name in _FILE_ATTRIBUTES:
                self.places.append((re.sub(r"\{[^}]*\}", "*", path), ""))
            else:
                self.places.append((os.path.join(path, "**", "*"), base))

    def send(self) -> None:
        """Rank 0: send every file written or changed since the last call."""
        if self.rank != 0:
            return
        for path, target in self._files():
            version = _version(path)
            if self.sent.get(path) == version:
                continue
            with open(path, "rb") as written:
                reporting.send_file(ENCODED + urllib.parse.quote(target, safe=""), written.read())
            self.sent[path] = version

    def _files(self) -> list[tuple[str, str]]:
        found = []
        for path in glob.glob(os.path.join(self.folder, "**", "*"), recursive=True):
            found.append((path, os.path.relpath(path, self.folder)))
        for pattern, under in self.places:
            root = pattern.split("**")[0] if under else ""
            for path in glob.glob(pattern, recursive=True):
                target = os.path.join(under, os.path.relpath(path, root)) if under else os.path.basename(path)
                found.append((path, target))
        return [(path, target) for path, target in found if os.path.isfile(path)]

    def close(self) -> None:
        self.send()
        os.chdir(self.previous)
        shutil.rmtree(self.folder, ignore_errors=True)


def _version(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def place(arrived: str, model_dir: str) -> list[str]:
    """Notebook side: move the callbacks' files that arrived in ``arrived`` to their place in
    ``model_dir``; returns their paths there."""
    placed: list[str] = []
    if not os.path.isdir(arrived):
        return placed
    for name in sorted(os.listdir(arrived)):
        if not name.startswith(ENCODED) or name.endswith(".partial"):
            continue
        relative = os.path.normpath(urllib.parse.unquote(name[len(ENCODED) :]))
        if os.path.isabs(relative) or relative.startswith(".."):
            continue  # a name that would leave model_dir
        target = os.path.join(model_dir, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(arrived, name), target)
        placed.append(target)
    return placed
