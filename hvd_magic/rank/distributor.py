"""What each rank of a ``TorchDistributor`` run does before the training code: Spark's
environment for it, then the function or the script (shipped by reference from the notebook)."""

from __future__ import annotations

import importlib.util
import linecache
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["RankSetup", "run_script", "run_train_function"]


@dataclass(frozen=True)
class RankSetup:
    """What each rank changes in its environment before the training code runs."""

    hide_gpus: bool = False  # use_gpu=False on Spark: CUDA_VISIBLE_DEVICES="", as Spark's sets it
    task_is_node: bool = False  # on Spark every task is a torchrun node of one process

    def apply(self) -> None:
        if self.hide_gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if self.task_is_node:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            if not self.hide_gpus and len(visible) > 1:  # the host's by local rank: keep this task's
                os.environ["CUDA_VISIBLE_DEVICES"] = visible[int(os.environ["LOCAL_RANK"])]
            node = {"RANK": "GROUP_RANK", "WORLD_SIZE": "GROUP_WORLD_SIZE"}
            os.environ.update(
                LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", **{v: os.environ[k] for k, v in node.items()}
            )


def run_train_function(
    train_function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], setup: RankSetup
) -> Any:
    """On each rank: ``train_function(*args, **kwargs)``."""
    setup.apply()
    return train_function(*args, **kwargs)


def run_script(path: str, argv: list[str], source: str | None, setup: RankSetup) -> None:
    """On each rank: the script as ``python path *argv`` would run it, in this process."""
    setup.apply()
    if source is None:  # not on the notebook's machine: this rank's own copy
        with open(path, "rb") as file:
            source = importlib.util.decode_source(file.read())
    code = compile(source, path, "exec")
    linecache.cache[path] = (len(source), None, source.splitlines(keepends=True), path)
    module = types.ModuleType("__main__")
    module.__file__ = path
    saved_main, saved_argv, saved_path = sys.modules["__main__"], sys.argv, list(sys.path)
    sys.modules["__main__"], sys.argv = module, list(argv)
    sys.path.insert(0, os.path.dirname(path))
    try:
        exec(code, module.__dict__)
    finally:
        sys.modules["__main__"], sys.argv, sys.path[:] = saved_main, saved_argv, saved_path
