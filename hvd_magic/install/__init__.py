"""``python -m hvd_magic install-horovod``: Horovod built for the environment it runs in.

detect (what is installed) -> plan (switches, cache entry, what is missing) -> build (patch, build,
cache, install). ``scripts/setup.sh`` uses the same path.
"""

from __future__ import annotations

import os
from pathlib import Path

from hvd_magic.install.build import install
from hvd_magic.install.detect import detect
from hvd_magic.install.plan import HOROVOD_VERSION, cached_wheel, make_plan

__all__ = ["HOROVOD_VERSION", "default_cache", "install_horovod"]


def default_cache() -> Path:
    """``$HVD_MAGIC_CACHE``, else ``$XDG_CACHE_HOME/hvd_magic``, else ``~/.cache/hvd_magic``."""
    if os.environ.get("HVD_MAGIC_CACHE"):
        return Path(os.environ["HVD_MAGIC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvd_magic"


def install_horovod(
    cache: Path | None = None,
    dry_run: bool = False,
    rebuild: bool = False,
    with_mpi: bool = True,
    sdist: Path | None = None,
) -> int:
    """Prints the plan; unless ``dry_run``, installs (building if the cache has no fitting wheel)."""
    plan = make_plan(detect(), cache or default_cache(), with_mpi)
    print(plan.describe(None if rebuild else cached_wheel(plan)), flush=True)
    if not dry_run:
        install(plan, lambda line: print(f"[install-horovod] {line}", flush=True), rebuild, sdist)
    return 0
