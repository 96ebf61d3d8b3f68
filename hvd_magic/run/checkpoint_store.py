"""The notebook's side of ``hvd_magic.checkpoint``: where a run's checkpoints are kept, and the
latest one handed to ranks that ``resume()``.

Rank 0 streams each checkpoint as a file (``FileChunk``); ``RankFiles`` writes it under a
temporary name and renames it once whole, so a checkpoint torn by a kill (of the rank, the
executor or the notebook) is never a name this store lists: the latest is always whole. The
last ``KEEP`` are kept. The folder is a local path of the notebook's machine, or any fsspec URL
(``s3://…``, ``abfss://…``, ``memory://…``; fsspec and the filesystem's package installed): the
files land in a local folder first and are copied there, again under a temporary name.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from typing import Any

from hvd_magic.errors import LaunchError
from hvd_magic.protocol import Message, ResumeAnswer, ResumeRequest
from hvd_magic.protocol.files import CHECKPOINT_PREFIX, checkpoint_name

__all__ = ["KEEP", "CheckpointStore"]

KEEP = 3
_NAME = re.compile(re.escape(CHECKPOINT_PREFIX) + r"(\d+)$")


class CheckpointStore:
    """A run's checkpoints: ``landed(path)`` when one arrived whole, ``latest()`` for resume."""

    def __init__(self, target: str | None = None, keep: int = KEEP) -> None:
        self.keep = keep
        self.last_landed: int | None = None  # the step of the checkpoint that arrived last
        self.given = bool(target)
        self.named = False  # its folder was named to the user (where a stop left the run): kept
        self._landings = 0  # checkpoints landed so far (what ``_shared`` was read after)
        self._shared: tuple[int, tuple[int, bytes] | None] | None = None  # the latest, as answered
        self.remote = bool(target) and "://" in str(target)
        self.fs: Any = None
        if self.remote:
            try:
                import fsspec
            except ImportError:
                raise LaunchError(
                    f"checkpoint_dir={target} is a URL, which needs fsspec: pip install fsspec (and the "
                    "package of its filesystem, e.g. s3fs), or give a local folder"
                ) from None
            self.fs, self.target = fsspec.core.url_to_fs(str(target))
            self.fs.makedirs(self.target, exist_ok=True)
            self._folder = ""
        else:
            self._folder = target or ""  # none given: a temporary folder, made when first needed
            if target:
                os.makedirs(target, exist_ok=True)
            self.target = target or ""

    @property
    def folder(self) -> str:
        """The local folder checkpoints arrive in (made on first use when none was given)."""
        if not self._folder:
            self._folder = tempfile.mkdtemp(prefix="hvd_magic-checkpoints-")
            if not self.remote:
                self.target = self._folder
        return self._folder

    def discard(self) -> None:
        """Without a ``checkpoint_dir``, checkpoints live as long as the run (and its retries)."""
        self._shared = None
        if self.named and not self.remote:
            return
        if self._folder and (self.remote or not self.given):  # a URL's local staging folder too
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = ""

    def steps(self) -> list[int]:
        """The steps of the whole checkpoints kept, oldest first."""
        if not self.remote and not self._folder:
            return []
        names = self.fs.ls(self.target, detail=False) if self.remote else os.listdir(self.folder)
        found = (_NAME.match(os.path.basename(str(name))) for name in names)
        return sorted(int(match.group(1)) for match in found if match)

    def latest(self) -> tuple[int, bytes] | None:
        """The highest step's checkpoint (one pruned meanwhile, by another run sharing the
        folder: the next highest)."""
        for step in reversed(self.steps()):
            try:
                if self.remote:
                    with self.fs.open(self._path(step), "rb") as file:
                        return step, file.read()
                with open(self._path(step), "rb") as file:
                    return step, file.read()
            except FileNotFoundError:
                continue
        return None

    def landed(self, path: str) -> None:
        """A checkpoint arrived whole at ``path`` (in ``folder``): publish it, keep the last."""
        found = _NAME.match(os.path.basename(path))
        self.last_landed = int(found.group(1)) if found else self.last_landed
        self._landings += 1
        if self.remote:
            final = f"{self.target}/{os.path.basename(path)}"
            self.fs.put_file(path, f"{final}.partial")
            self.fs.mv(f"{final}.partial", final)
            os.unlink(path)
        for step in self.steps()[: -self.keep]:
            with contextlib.suppress(FileNotFoundError):  # pruned by another run sharing the folder
                if self.remote:
                    self.fs.rm(self._path(step))
                else:
                    os.unlink(self._path(step))

    def answer(self, message: Message) -> tuple[ResumeAnswer, bytes]:
        """The hub's answer to a rank's ``ResumeRequest``. An attempt's ranks ask at once: the
        latest is read once and the answers share it (np copies of a large checkpoint in the
        kernel, else), until the next checkpoint lands."""
        assert isinstance(message.record, ResumeRequest)
        try:
            if self._shared is not None and self._shared[0] == self._landings:
                latest = self._shared[1]
            else:
                landings, latest = self._landings, self.latest()
                self._shared = (landings, latest)  # (a checkpoint landing meanwhile: read again next)
        except Exception as err:  # noqa: BLE001 (an object store's own errors: gcsfs', adlfs'): the rank raises it
            return ResumeAnswer(message.record.id, error=f"{self.target}: {type(err).__name__}: {err}"), b""
        if latest is None:
            return ResumeAnswer(message.record.id), b""
        return ResumeAnswer(message.record.id, step=latest[0], found=True), latest[1]

    def _path(self, step: int) -> str:
        if self.remote:
            return f"{self.target}/{checkpoint_name(step)}"
        return os.path.join(self.folder, checkpoint_name(step))
