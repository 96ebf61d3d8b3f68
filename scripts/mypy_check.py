"""mypy as ``make lint`` runs it, from the cache that the last clean check of the same pins left.

A cold check reads the annotated stack (PyTorch, TensorFlow, pyspark, IPython...): about 23
CPU-seconds here, in every fresh clone. mypy's incremental mode takes a cache whose files name
other paths (another clone, another venv of the same pins): it compares each source's hash where
the modification time differs, and rereads only what changed (7 CPU-s from another clone's cache).

- Before the check, where the clone has no ``.mypy_cache`` of its own, the kept one is unpacked
  into it (one tar file beside Horovod's wheel and the kept bytecode, per Python and pins).
- After a check that passed, the clone's cache is kept for the next clone, replacing the file
  whole (a clone reading the old one meanwhile still reads all of it).
- A check that crashes (``INTERNAL ERROR``) on a cache it did not write runs again cold.

    python scripts/mypy_check.py      # exit status and messages: mypy's
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bytecode import ROOT, pins, prune  # noqa: E402 - the key and the rule of what is kept, said once

from hvd_magic.install import default_cache  # noqa: E402 - where Horovod's wheel is kept

CACHE = ROOT / ".mypy_cache"
CRASH = "INTERNAL ERROR"


def kept_file() -> Path:
    return default_cache() / "mypy" / f"{sys.implementation.cache_tag}-{pins()}.tar"


def take(kept: Path, cache: Path = CACHE) -> bool:
    """The kept cache unpacked into ``cache``, where there is none; whether one was taken."""
    if cache.exists() or not kept.is_file():
        return False
    part = cache.with_name(f"{cache.name}.{os.getpid()}.part")
    try:
        with tarfile.open(kept) as archive:
            archive.extractall(part, filter="data")
        part.rename(cache)
    except (OSError, tarfile.TarError):  # removed or replaced meanwhile: a cold check
        shutil.rmtree(part, ignore_errors=True)
        return False
    return True


def keep(kept: Path, cache: Path = CACHE) -> None:
    """``cache`` kept as ``kept``, replaced whole; only the newest pins' files stay (``prune``)."""
    kept.parent.mkdir(parents=True, exist_ok=True)
    part = kept.with_name(f"{kept.name}.{os.getpid()}.part")
    with tarfile.open(part, "w") as archive:
        archive.add(cache, arcname=".")
    os.replace(part, kept)
    prune(kept.parent, "*.tar")


def check() -> int:
    """mypy's exit status, 2 where it crashed (its messages passed on)."""
    mypy = [sys.executable, "-m", "mypy"]
    done = subprocess.run(mypy, cwd=ROOT, capture_output=True, text=True, check=False)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return 2 if CRASH in done.stdout + done.stderr else done.returncode


def main(kept: Path | None = None, cache: Path = CACHE, check: Callable[[], int] = check) -> int:
    kept = kept or kept_file()
    taken = take(kept, cache)
    status = check()
    if status == 2 and taken:
        print("mypy crashed on the kept cache; checking again without it", file=sys.stderr)
        shutil.rmtree(cache, ignore_errors=True)
        status = check()
    if status == 0:
        keep(kept, cache)
    return status


if __name__ == "__main__":
    sys.exit(main())
