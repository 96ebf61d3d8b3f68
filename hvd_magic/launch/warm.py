"""Warm ranks on this machine: local ranks forked from a process that has imported PyTorch once
(``hvd_magic.rank.forkserver``), instead of each importing it anew (1.5 to 3 CPU-seconds a rank,
the most of a small cell's start).

Which runs: ranks on this machine (np < 0) whose code imports PyTorch (``torch``,
``horovod.torch``) and no other framework, and that set no ``env=`` of their own (a variable
read at import would not reach a rank forked from a process that imported already). Others,
and every rank where ``HVD_MAGIC_WARM_RANKS=0``, start the usual way. The server starts with
the first such run (it pays the imports once, in that run's start) and stays for the next
ones while the kernel lives; a server that died, or whose PyTorch or Horovod was reinstalled
since, or whose imports read a variable the notebook has changed since, is started anew.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable

import psutil

from hvd_magic.options import RunOptions
from hvd_magic.protocol.files import forked_rank_file

__all__ = ["ENV_WARM_RANKS", "forked_ranks", "stand_in_command", "warm_modules"]

ENV_WARM_RANKS = "HVD_MAGIC_WARM_RANKS"  # "0": every local rank starts the usual way
READY_SECONDS = 120.0  # the server's imports, on a loaded machine
WORKER = "hvd_magic.rank.worker"  # its own imports, preloaded too
IMPORT_VARIABLES = ("TORCH", "PYTORCH", "PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_")
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
    they start the usual way."""
    names = set(imports)
    other = any(_within(name, *_COLD) for name in names)
    if not any(_within(name, "torch", "horovod.torch") for name in names) or other:
        return ()
    if options.np >= 0 or options.env or os.environ.get(ENV_WARM_RANKS) == "0":
        return ()
    if importlib.util.find_spec("torch") is None:
        return ()
    horovod = any(_within(name, "horovod.torch") for name in names) and importlib.util.find_spec("horovod")
    return ("torch", "horovod.torch", WORKER) if horovod else ("torch", WORKER)


class _Server:
    """One fork server, and what it was started from."""

    def __init__(self, modules: tuple[str, ...]) -> None:
        self.modules, self.installed, self.read_at_import = modules, _installed(modules), _read_at_import()
        self.folder = tempfile.mkdtemp(prefix="hvd_magic-fork-")  # the user's only (0700)
        self.socket = os.path.join(self.folder, "socket")
        self.log = open(os.path.join(self.folder, "log"), "w+b")  # noqa: SIM115 - the server's stderr
        argv = [sys.executable, "-m", "hvd_magic.rank.forkserver", self.socket, *modules]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,  # held: its end is the server's
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
            cwd=self.folder,
            start_new_session=True,  # the notebook's Ctrl-C is not the server's
        )

    def ready(self, timeout: float) -> bool:
        """Whether it said ``ready`` within ``timeout`` seconds."""
        said: list[bytes] = []
        stdout = self.process.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: said.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return said == [b"ready\n"]

    def usable(self) -> bool:
        """Alive, and what it imported would be imported alike now: the same files, and the same
        variables that the imports read."""
        same = _installed(self.modules) == self.installed and _read_at_import() == self.read_at_import
        return self.process.poll() is None and same

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _read_at_import() -> dict[str, str]:
    """The notebook's variables that PyTorch, its OpenMP and the interpreter may read at import
    (a rank forked later would not see a new value of one)."""
    return {name: value for name, value in os.environ.items() if name.startswith(IMPORT_VARIABLES)}


def _installed(modules: tuple[str, ...]) -> dict[str, float]:
    """When each preloaded package's files last changed (a reinstall changes them)."""
    found = {}
    for name in {module.split(".")[0] for module in modules}:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            with contextlib.suppress(OSError):
                found[name] = os.stat(spec.origin).st_mtime
    return found


_servers: dict[tuple[str, ...], _Server] = {}
_retired: list[_Server] = []  # replaced, closed when the kernel ends
_failed: set[tuple[str, ...]] = set()
_lock = threading.Lock()


def stand_in_command(modules: tuple[str, ...]) -> list[str] | None:
    """The command a launcher starts for each rank so that it is forked from a server that has
    imported ``modules``; None if no server could start (the ranks then start the usual way)."""
    with _lock:
        server = _servers.get(modules)
        if server is not None and not server.usable():
            _retired.append(_servers.pop(modules))  # its ranks of a run still going keep running
            server = None
        if server is None:
            if modules in _failed:
                return None
            server = _Server(modules)
            if not server.ready(READY_SECONDS):
                server.close()
                _failed.add(modules)  # not tried again in this kernel: its ranks start the usual way
                return None
            _servers[modules] = server
    stand_in = importlib.util.find_spec("hvd_magic.rank.forked")
    assert stand_in is not None and stand_in.origin is not None
    # by path, isolated (-I): no package to import, and no module beside it taken for the stdlib's
    return [sys.executable, "-I", stand_in.origin, server.socket]


def forked_ranks(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """The warm ranks running for those of ``processes`` that are their stand-ins."""
    with _lock:
        folders = [server.folder for server in [*_servers.values(), *_retired]]
    found = []
    for process, folder in itertools.product(processes, folders):
        try:
            with open(forked_rank_file(folder, process.pid)) as note:
                found.append(psutil.Process(int(note.read())))
        except (OSError, ValueError, psutil.Error):
            continue
    return found


@atexit.register
def _close_all() -> None:
    with _lock:
        for server in [*_servers.values(), *_retired]:
            server.close()
        _servers.clear()
        _retired.clear()
