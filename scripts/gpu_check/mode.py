"""What every check shares: the mode it runs in (the GPU, or the CPU dry run), its failure, the
shell its cells run through, and the live view's figures as TensorBoard keeps them."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Failed(Exception):
    """A check's reason for failing, in words."""


@dataclass(frozen=True)
class Mode:
    gpu: bool
    work: Path  # scratch for this check

    @property
    def device(self) -> str:
        return "cuda" if self.gpu else "cpu"

    @property
    def nccl(self) -> str:
        return "nccl" if self.gpu else "gloo"

    def cell(self, source: str, **more: Any) -> str:
        return source.format(device=self.device, nccl=self.nccl, **more)


def expect(condition: bool, reason: str) -> None:
    if not condition:
        raise Failed(reason)


def shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    if "hvd_magic" not in ip.extension_manager.loaded:  # the CPU dry run's checks share one shell
        ip.run_line_magic("load_ext", "hvd_magic")
    return ip


def scalars(logdir: Path) -> Any:
    """The one run under ``logdir`` (a run's ``logdir=``), read by TensorBoard's own reader."""
    # without TensorFlow, as on the GPU image: where TensorFlow is installed (the CPU dry run) the
    # reader would import it, seconds of CPU and a GB, to read event files
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.backend.event_processing import event_accumulator

    (run,) = logdir.iterdir()
    return event_accumulator.EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
