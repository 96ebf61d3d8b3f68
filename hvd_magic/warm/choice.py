"""Which runs get warm ranks: ranks forked from a process that has imported the framework once
(``warm.servers``, ``hvd_magic.warm.fork_server``) instead of each importing it anew (1.5 to
3 CPU-seconds a rank for PyTorch, 4 to 6 for TensorFlow and Keras: the most of a small cell's
start).

Ranks whose code imports PyTorch, TensorFlow or Keras (and Horovod's bindings of them, and the
trainers built on PyTorch: Hugging Face's Trainer, Lightning, Accelerate), and no
framework that cannot be forked once imported (JAX, MXNet): on this machine (np < 0), from a
server the kernel keeps; on Spark, from a server each executor keeps. Ranks on this machine of
code that imports no framework are forked too, from a server of the rank's own modules only:
Python's start and hvd_magic's rank side are about half of such a cell's cost
(``bench/warm_ranks.py --framework none``, docs/sessions.md). On Spark they start the usual way:
there a server is not shared through a preloader, and each executor's would cost its own imports
before its first rank. A run's ``env=`` keeps ranks warm: a rank takes its environment after the
fork, and a variable the frameworks or the interpreter may read at import
(``TF_USE_LEGACY_KERAS``, ``LD_PRELOAD``) gets a server started with it (``warm.servers`` keys
its servers by them). Others, and every rank where ``HVD_MAGIC_WARM_RANKS=0`` is set in the
notebook, start the usual way.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable

from hvd_magic.protocol.env import WORKER  # its own imports, preloaded too

__all__ = ["ENV_WARM_RANKS", "warm_modules"]

ENV_WARM_RANKS = "HVD_MAGIC_WARM_RANKS"  # "0": every rank starts the usual way
# What a server may preload, each where the code imports it or a module of it: importing them
# neither starts a GPU's driver nor leaves a thread holding a lock that a fork would copy.
FRAMEWORKS = ("torch", "tensorflow", "keras", "tf_keras")
TRAINERS = ("transformers", "lightning", "pytorch_lightning", "accelerate")
BINDINGS = {  # Horovod's binding -> the framework preloaded for it (the rank imports the binding)
    "horovod.torch": "torch",
    "horovod.tensorflow": "tensorflow",
    "horovod.keras": "keras",
    "horovod.tensorflow.keras": "tensorflow",
}
# The trainers are built on PyTorch: preloaded with it (and with what they import on first use,
# below): 2.4 to 2.6 CPU-s a rank for a HF Trainer or Lightning, 0.4 for Accelerate. Importing them
# starts no thread and asks no GPU (checked: no torch.cuda call, no thread, at their import).
BUILT_ON = dict.fromkeys(TRAINERS, "torch")
# What a framework imports on its first use, which every rank would otherwise import anew:
# PyTorch's optimizers import torch._dynamo (with SymPy, about 830 modules, 1.0 to 1.8 CPU-s) the
# first time one is made or stepped. Preloaded with the framework, though a rank that makes no
# optimizer finds them in sys.modules too; they start no thread and no GPU driver. A server
# whose framework lacks them (an older PyTorch) preloads the rest, and its ranks import as they would.
FIRST_USE = {"torch": ("torch._dynamo",), "transformers": ("transformers.trainer",)}  # Trainer: lazily loaded
_COLD = ("jax", "mxnet", "horovod.mxnet")  # JAX warns that a fork of it may deadlock


def _within(name: str, *packages: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def _preload(names: set[str]) -> tuple[str, ...]:
    """The frameworks ``names`` import, themselves or through Horovod's binding of them, in
    order, each followed by what it imports on first use. Not the bindings: with its framework
    imported, a binding takes a rank 0.02 to 0.04 CPU-s, and one server then serves the cells of
    a framework whatever their launcher (Horovod's, or torch.distributed's ``backend=torch``)."""
    wanted = {module for module in (*FRAMEWORKS, *TRAINERS) if any(_within(name, module) for name in names)}
    wanted |= {
        framework for binding, framework in BINDINGS.items() if any(_within(name, binding) for name in names)
    }
    wanted |= {BUILT_ON[module] for module in wanted if module in BUILT_ON}
    chosen = (module for module in (*FRAMEWORKS, *TRAINERS) if module in wanted)
    return tuple(loaded for module in chosen for loaded in (module, *FIRST_USE.get(module, ())))


def warm_modules(imports: Iterable[str], here: bool) -> tuple[str, ...]:
    """What a fork server for these ranks preloads: each framework the code imports (and only
    those, with what they import on first use: a rank must not find in ``sys.modules`` what its
    code would never have imported), then our worker's modules (only those, for ranks here of
    no framework); () where they start the usual way. ``here``: the ranks run on this machine.
    On Spark what the executors have installed is not known here: a server that cannot import
    them is not used, and the ranks start the usual way."""
    names = set(imports)
    preload = _preload(names)
    if (not preload and not here) or any(_within(name, *_COLD) for name in names):
        return ()
    if os.environ.get(ENV_WARM_RANKS) == "0":
        return ()
    if here and any(importlib.util.find_spec(name.split(".")[0]) is None for name in preload):
        return ()  # not installed here: each rank's own import error says so
    return (*preload, WORKER)
