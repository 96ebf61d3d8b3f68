from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell

RUN_MARKERS = ("hvd_magic.worker", "mpirun", "orted", "hvd_magic.launch.agent")


def wait_for_files(paths: list[Path], timeout: float) -> bool:
    """True once every path exists, False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def leftover_processes(root: psutil.Process | None = None) -> list[str]:
    """Processes of a run (below ``root``, by default this process) that must not be left behind."""
    found = []
    for process in (root or psutil.Process()).children(recursive=True):
        try:
            cmdline = " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        if any(marker in cmdline for marker in RUN_MARKERS):
            found.append(f"{process.pid}: {cmdline}")
    return found


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext hvd_magic")
    yield shell
    shell.reset()
    assert leftover_processes() == []


@pytest.fixture(autouse=True)
def _no_thread_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests check the budget the launcher sets; a developer's OMP_NUM_THREADS would hide it.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        monkeypatch.delenv(var, raising=False)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
