"""The fork servers warm ranks are forked from (``hvd_magic.warm.fork_server``), kept by the process
that launches ranks (the notebook's kernel, for local ranks) or, on an executor, shared by the
executor's Python workers and kept by its Python daemon (``keeper``): Spark ends an idle Python
worker after a minute without tasks and kills a cancelled task's, but keeps the daemon as long as
the executor. A server starts with the first run that needs it (a kernel's is forked from this
machine's preloader of it, ``warm.preloaders``: the imports are paid once for every kernel of the
user; an executor's imports for itself) and stays while its keeper lives; one that died, whose
framework or Horovod was reinstalled since, or whose imports read a variable changed since, is
started anew. Which runs are warm is decided on the notebook's side (``warm.choice``); this
module imports nothing of it, as it runs in Spark tasks.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping

import psutil

from hvd_magic.protocol.env import worker_command
from hvd_magic.protocol.files import forked_rank_file
from hvd_magic.warm.preloaders import (
    forked_server,
    identity,
    listening,
    locked,
    read_at_import,
    remove_ended,
    shared_base,
)

__all__ = ["forked_ranks", "own_processes", "rank_command", "server_tree", "serving", "stand_in"]

READY_SECONDS = 120.0  # the server's imports, on a loaded machine


class _Server:
    """One fork server, and what it was started from: forked from a preloader (``preloaders``),
    or started here where there is none."""

    def __init__(
        self, modules: tuple[str, ...], env: Mapping[str, str], folder: str = "", keeper: int | None = None
    ) -> None:
        self.modules, self.identity = modules, identity(modules, env)
        self.read_at_import = read_at_import(modules, env)
        self.folder = folder or tempfile.mkdtemp(prefix="hvd_magic-fork-")  # the user's only (0700)
        self.socket = os.path.join(self.folder, "socket")
        environment = os.environ | self.read_at_import | {"PYTHONUNBUFFERED": "1"}
        self.started: subprocess.Popen[bytes] | None = None
        # a server of this process's own comes from the user's preloader; an executor's shared one
        # is started by the task's Python worker, below the executor, as its ranks are
        forked = (
            forked_server(modules, environment, self.identity, self.socket, os.getpid())
            if keeper is None
            else None
        )
        if forked is not None:
            self.pid = forked
            return
        shared = ["--keeper", str(keeper)] if keeper is not None else []
        argv = [sys.executable, "-m", "hvd_magic.warm.fork_server", *shared, self.socket, *modules]
        with open(os.path.join(self.folder, "log"), "wb") as log:  # the server's stderr
            self.started = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE
                if keeper is None
                else subprocess.DEVNULL,  # held: its end is the server's
                stdout=subprocess.PIPE,
                stderr=log,
                env=environment,
                cwd=self.folder,
                start_new_session=True,  # the notebook's Ctrl-C is not the server's
            )
        self.pid = self.started.pid

    def ready(self, timeout: float) -> bool:
        """Whether it said ``ready`` within ``timeout`` seconds (one forked from a preloader
        listened before its pid came)."""
        if self.started is None:
            return True
        said: list[bytes] = []
        stdout = self.started.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: said.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return said == [b"ready\n"]

    def usable(self, env: Mapping[str, str]) -> bool:
        """Alive, and what it imported would be imported alike for ranks of ``env``: the same
        files, and the same variables that the imports read."""
        return self._alive() and identity(self.modules, env) == self.identity

    def _alive(self) -> bool:
        if self.started is not None:
            return self.started.poll() is None
        try:  # a preloader's child: reaped by the preloader, or by init once it ended
            return bool(psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def close(self) -> None:
        if self.started is not None and self.started.stdin is not None:
            with contextlib.suppress(OSError):
                self.started.stdin.close()
        else:  # one that ends with its keeper (this process, or a shared server's): told to end now
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGTERM)
        try:
            if self.started is not None:
                self.started.wait(timeout=5)
            else:
                psutil.Process(self.pid).wait(timeout=5)
        except (subprocess.TimeoutExpired, psutil.TimeoutExpired):
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        except psutil.Error:
            pass
        if self.started is not None:
            self.started.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


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
    if customized(env):
        return None
    base = shared_base() if keeper is not None else None
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


def customized(env: Mapping[str, str]) -> bool:
    """Whether ranks of ``env`` find a ``sitecustomize`` or ``usercustomize`` of their own on their
    PYTHONPATH (the notebook's folder is on it): Python runs it as a rank starts, which a rank
    forked from a server that started before never would, so they start the usual way."""
    path = (os.environ | dict(env)).get("PYTHONPATH", "")
    return any(
        os.path.isfile(os.path.join(entry, f"{name}.py"))
        for entry in path.split(os.pathsep)
        if entry
        for name in ("sitecustomize", "usercustomize")
    )


def _shared_serving(modules: tuple[str, ...], env: Mapping[str, str], keeper: int, base: str) -> str | None:
    """The server shared under ``keeper``: in a folder of ``base`` named by the keeper and by what
    the server imports (the modules, their files' times, the variables read at import), started
    under a lock by the first process that finds none listening there."""
    name = f"{keeper}-{hashlib.sha256(identity(modules, env).encode()).hexdigest()[:20]}"
    folder = os.path.join(base, name)
    with open(os.path.join(base, f"{name}.lock"), "a") as lock:
        if not locked(lock, READY_SECONDS):
            return None
        pid = listening(folder)
        if pid is None:
            remove_ended(base)
            shutil.rmtree(folder, ignore_errors=True)  # a server killed before it could remove it
            os.mkdir(folder, 0o700)
            server = _Server(modules, env, folder, keeper)
            if not server.ready(READY_SECONDS):
                server.close()
                return None
            pid = server.pid
            with open(os.path.join(folder, "pid"), "w") as note:
                note.write(str(pid))
        _shared[folder] = pid
        return os.path.join(folder, "socket")


def stand_in() -> list[str]:
    """A warm rank's stand-in, without its server's socket (``ENV_FORK_SERVER`` names it then)."""
    found = importlib.util.find_spec("hvd_magic.warm.stand_in")
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
        pids = [server.pid for server in [*_servers.values(), *_retired]] + list(_shared.values())
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
