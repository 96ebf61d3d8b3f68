"""The fork servers warm ranks are forked from (``hvd_magic.rank.forkserver``), kept by the process
that launches ranks (the notebook's kernel, for local ranks) or, on an executor, shared by the
executor's Python workers and kept by its Python daemon (``keeper``): Spark ends an idle Python
worker after a minute without tasks and kills a cancelled task's, but keeps the daemon as long as
the executor. A server starts with the first run that needs it (it pays the imports once, in
that run's start) and stays while its keeper lives; one that died, whose framework or Horovod was
reinstalled since, or whose imports read a variable changed since, is started anew. Which runs
are warm is decided on the notebook's side (``launch.warm``); this module imports nothing of it,
as it runs in Spark tasks.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO

import psutil

from hvd_magic.launch.processes import THREAD_VARS, worker_command
from hvd_magic.protocol.files import forked_rank_file

__all__ = ["forked_ranks", "own_processes", "rank_command", "server_tree", "serving", "stand_in"]

READY_SECONDS = 120.0  # the server's imports, on a loaded machine
IMPORT_VARIABLES = ("TORCH", "PYTORCH", "TF_", "KERAS_", "PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_")
# ... but not these: a rank takes its thread budget after the fork (``rank.forkserver``), and its
# own sys.path and streams
TAKEN_AFTER_FORK = (*THREAD_VARS, "TF_NUM_INTEROP_THREADS", "PYTHONPATH", "PYTHONUNBUFFERED")


class _Server:
    """One fork server, and what it was started from."""

    def __init__(
        self, modules: tuple[str, ...], env: Mapping[str, str], folder: str = "", keeper: int | None = None
    ) -> None:
        self.modules, self.identity = modules, _identity(modules, env)
        self.read_at_import = _read_at_import(env)
        self.folder = folder or tempfile.mkdtemp(prefix="hvd_magic-fork-")  # the user's only (0700)
        self.socket = os.path.join(self.folder, "socket")
        self.log = open(os.path.join(self.folder, "log"), "w+b")  # noqa: SIM115 - the server's stderr
        shared = ["--keeper", str(keeper)] if keeper is not None else []
        argv = [sys.executable, "-m", "hvd_magic.rank.forkserver", *shared, self.socket, *modules]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if keeper is None else subprocess.DEVNULL,  # held: its end is the server's
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=os.environ | self.read_at_import | {"PYTHONUNBUFFERED": "1"},
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

    def usable(self, env: Mapping[str, str]) -> bool:
        """Alive, and what it imported would be imported alike for ranks of ``env``: the same
        files, and the same variables that the imports read."""
        return self.process.poll() is None and _identity(self.modules, env) == self.identity

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        else:  # a shared server, which ends with its keeper: ended here only when it never was ready
            self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _read_at_import(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of the ranks' environment (this process's, and the run's ``env`` over it)
    that the frameworks, their OpenMP and the interpreter may read at import: a rank forked
    later would not see another value of one (``TF_USE_LEGACY_KERAS``, say)."""
    merged = os.environ | dict(env)
    return {
        name: value
        for name, value in merged.items()
        if name.startswith(IMPORT_VARIABLES) and name not in TAKEN_AFTER_FORK
    }


def _identity(modules: tuple[str, ...], env: Mapping[str, str]) -> str:
    """What a server for ranks of ``env`` imports, as it would import it: the interpreter, the
    modules, their files' times and the variables the imports read. A server serves where this
    is its own."""
    return json.dumps([sys.executable, modules, _installed(modules), _read_at_import(env)], sort_keys=True)


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
_shared: dict[str, int] = {}  # the folders of the shared servers this process used, their pids
_lock = threading.Lock()


def serving(modules: tuple[str, ...], env: Mapping[str, str], keeper: int | None = None) -> str | None:
    """The socket of a fork server that has imported ``modules`` as ranks of the run's ``env``
    would, started if there is none (or none usable); None if none could start (the ranks then
    start the usual way). This process's own, or, with ``keeper``, the one shared by every process
    of this user with that keeper, which lasts as long as the keeper does (``launch.task.shared``)."""
    base = _shared_base() if keeper is not None else None
    if keeper is not None and base is not None:  # (else this process's own)
        with _lock:
            found = None if modules in _failed else _shared_serving(modules, env, keeper, base)
            if found is None:
                _failed.add(modules)
            return found
    with _lock:
        server = _servers.get(modules)
        if server is not None and not server.usable(env):
            _retired.append(_servers.pop(modules))  # its ranks of a run still going keep running
            server = None
        if server is None:
            if modules in _failed:
                return None
            server = _Server(modules, env)
            if not server.ready(READY_SECONDS):
                server.close()
                _failed.add(modules)  # not tried again by this process: its ranks start the usual way
                return None
            _servers[modules] = server
        return server.socket


def _shared_serving(modules: tuple[str, ...], env: Mapping[str, str], keeper: int, base: str) -> str | None:
    """The server shared under ``keeper``: in a folder of ``base`` named by the keeper and by what
    the server imports (the modules, their files' times, the variables read at import), started
    under a lock by the first process that finds none listening there."""
    name = f"{keeper}-{hashlib.sha256(_identity(modules, env).encode()).hexdigest()[:20]}"
    folder = os.path.join(base, name)
    with open(os.path.join(base, f"{name}.lock"), "a") as lock:
        if not _locked(lock, READY_SECONDS):
            return None
        pid = _listening(folder)
        if pid is None:
            _remove_ended(base)
            shutil.rmtree(folder, ignore_errors=True)  # a server killed before it could remove it
            os.mkdir(folder, 0o700)
            server = _Server(modules, env, folder, keeper)
            if not server.ready(READY_SECONDS):
                server.close()
                return None
            pid = server.process.pid
            with open(os.path.join(folder, "pid"), "w") as note:
                note.write(str(pid))
        _shared[folder] = pid
        return os.path.join(folder, "socket")


def _shared_base() -> str | None:
    """This user's folder of shared servers (0700), or None where it is not this user's alone."""
    base = os.path.join(tempfile.gettempdir(), f"hvd_magic-servers-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    found = os.lstat(base)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None
    return base


def _locked(lock: IO[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _listening(folder: str) -> int | None:
    """The pid of the server of ``folder`` if it is there (its socket is in place once it listens)."""
    try:
        with open(os.path.join(folder, "pid")) as note:
            pid = int(note.read())
        alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        return pid if alive and os.path.exists(os.path.join(folder, "socket")) else None
    except (OSError, ValueError, psutil.Error):
        return None


def _remove_ended(base: str) -> None:
    """What shared servers of keepers that ended left (their server killed with them). The
    workers of other keepers may sweep at the same time: what one removed, another finds gone."""
    for entry in os.listdir(base):
        keeper = entry.split("-", 1)[0]
        if keeper.isdigit() and not psutil.pid_exists(int(keeper)):
            path = os.path.join(base, entry)
            if entry.endswith(".lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
            else:
                shutil.rmtree(path, ignore_errors=True)


def stand_in() -> list[str]:
    """A warm rank's stand-in, without its server's socket (``ENV_FORK_SERVER`` names it then)."""
    found = importlib.util.find_spec("hvd_magic.rank.forked")
    assert found is not None and found.origin is not None
    # by path, isolated (-I): no package to import, and no module beside it taken for the stdlib's
    return [sys.executable, "-I", found.origin]


def rank_command(socket: str | None) -> list[str]:
    """A rank's command: a stand-in for a rank forked from the server at ``socket``, where there
    is one, else the rank itself."""
    return [*stand_in(), socket] if socket else worker_command()


def server_tree() -> set[int]:
    """The pids of this process's fork servers and of everything they forked (their waiters,
    the ranks), which a task that stops its descendants must not take for its own."""
    with _lock:
        pids = [server.process.pid for server in [*_servers.values(), *_retired]] + list(_shared.values())
    tree = set(pids)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            tree |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    return tree


def own_processes() -> list[psutil.Process]:
    """What this process started, with the warm ranks forked for its stand-ins (not below it when
    their server is shared); not its fork servers, kept for the next runs, nor what they forked
    for others."""
    servers = server_tree()
    mine = [child for child in psutil.Process().children(recursive=True) if child.pid not in servers]
    return mine + forked_ranks(mine)


def forked_ranks(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """The warm ranks running for those of ``processes`` that are their stand-ins."""
    with _lock:
        folders = [server.folder for server in [*_servers.values(), *_retired]] + list(_shared)
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
