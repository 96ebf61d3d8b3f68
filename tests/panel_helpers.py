"""The kernel's record of its runs as the Horovod panel sees it: served by a real ``RunEndpoint``
(a ZeroMQ ``ipc://`` socket in a temporary runtime folder) and asked as the server asks it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hvd_magic.protocol.panel import endpoint_folder
from hvd_magic.run.endpoint import RunEndpoint
from hvd_magic.run.history import HISTORY, History
from hvd_magic.server.kernels import KernelRuns

KERNEL = "k"


class Panel:
    """Asks the endpoint in ``folder`` (one short-lived socket a request, as the server does)."""

    def __init__(self, folder: Path, kernel: str = KERNEL) -> None:
        self.folder, self.kernel = folder, kernel

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        runs = KernelRuns(self.folder)
        try:
            endpoint = runs.endpoints({self.kernel})[self.kernel]
            answer: dict[str, Any] = asyncio.run(runs.ask(endpoint, request, seconds=30))
            return answer
        finally:
            runs.close()

    def row(self, number: int) -> dict[str, Any]:
        """Run ``number`` as the panel lists it."""
        rows = [row for row in self.ask({"ask": "runs"})["runs"] if row["number"] == number]
        assert rows, f"run {number} is not listed"
        return rows[0]

    def wait_for(self, seen: Callable[[dict[str, Any]], bool], seconds: float = 120) -> dict[str, Any]:
        """The newest run's row, once ``seen`` says it is what the test waits for."""
        deadline = time.monotonic() + seconds
        while True:
            runs = self.ask({"ask": "runs"})["runs"]
            if runs and seen(runs[-1]):
                return runs[-1]
            assert time.monotonic() < deadline, f"not seen within {seconds:.0f} s: {runs[-1:] or 'no run'}"
            time.sleep(0.1)


def kernels_panel(manager: Any) -> Panel:
    """What the panel asks of a real kernel (``jupyter_client``'s ``manager``): its endpoint in
    the folder of its connection file, named by the kernel's id as that file names it."""
    connection = Path(manager.connection_file)
    return Panel(endpoint_folder(connection.parent), connection.stem.removeprefix("kernel-"))


@contextlib.contextmanager
def served(tmp_path: Path, history: History = HISTORY) -> Iterator[Panel]:
    """``history`` (the kernel's record) served as in a Jupyter kernel while the block runs."""
    folder = endpoint_folder(tmp_path / "runtime")
    endpoint = RunEndpoint(history, folder, KERNEL)
    try:
        yield Panel(folder)
    finally:
        endpoint.close()
