"""Which runs get warm ranks: ranks forked from a process that has imported PyTorch once
(``launch.forkservers``, ``hvd_magic.rank.forkserver``) instead of each importing it anew (1.5 to
3 CPU-seconds a rank, the most of a small cell's start).

Ranks whose code imports PyTorch (``torch``, ``horovod.torch``) and no other framework, and that
set no ``env=`` of their own (a variable read at import would not reach a rank forked from a
process that imported already): on this machine (np < 0), from a server the kernel keeps; on
Spark, from a server each task's Python worker keeps on its executor. Others, and every rank
where ``HVD_MAGIC_WARM_RANKS=0`` is set in the notebook, start the usual way.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hvd_magic.options import RunOptions

__all__ = ["ENV_WARM_RANKS", "warm_modules"]

ENV_WARM_RANKS = "HVD_MAGIC_WARM_RANKS"  # "0": every rank starts the usual way
WORKER = "hvd_magic.rank.worker"  # its own imports, preloaded too
_COLD = (
    "tensorflow",
    "keras",
    "tf_keras",
    "jax",
    "mxnet",
    "horovod.tensorflow",
    "horovod.keras",
    "horovod.mxnet",
)


def _within(name: str, *packages: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def warm_modules(imports: Iterable[str], options: RunOptions) -> tuple[str, ...]:
    """What a fork server for these ranks preloads: PyTorch, and Horovod's binding where the code
    imports it (a rank must not find in ``sys.modules`` what its code never imported); () where
    they start the usual way. On Spark what the executors have installed is not known here: a
    server that cannot import them is not used, and the ranks start the usual way."""
    names = set(imports)
    other = any(_within(name, *_COLD) for name in names)
    if not any(_within(name, "torch", "horovod.torch") for name in names) or other:
        return ()
    if options.env or os.environ.get(ENV_WARM_RANKS) == "0":
        return ()
    local = options.np < 0
    if local and importlib.util.find_spec("torch") is None:
        return ()
    horovod = any(_within(name, "horovod.torch") for name in names)
    if horovod and (not local or importlib.util.find_spec("horovod")):
        return ("torch", "horovod.torch", WORKER)
    return ("torch", WORKER)
