"""What tells fork servers apart (``identity``: what a server imports, as it would import it),
this user's folder of shared fork servers on this machine, and the preloaders servers are forked
from (``hvd_magic.warm.preloader``).

A preloader imports a server's modules once, as a server of its identity would, and forks a
server for each kernel that asks, in milliseconds: a restarted kernel or another notebook starts
its ranks warm instead of importing the framework anew. (An executor's server is not forked from
one: it stays below the executor, as its ranks must.) It lives in the folder of shared servers,
is started under its lock by the first that finds none listening, and ends after
``IDLE_SECONDS`` without a request. Where there is no such folder of this user's only, there is
no preloader: servers are started as they were.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO

import psutil

from hvd_magic.protocol.env import THREAD_VARS

__all__ = [
    "IDLE_SECONDS",
    "forked_server",
    "identity",
    "listening",
    "locked",
    "read_at_import",
    "remove_ended",
    "shared_base",
]

INTERPRETER_VARIABLES = ("PYTHON", "LD_")  # read by the interpreter itself, whatever it imports
IMPORT_VARIABLES = (
    *("TORCH", "PYTORCH", "TF_", "KERAS_", "PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_"),
    # ... and the trainers' (Hugging Face's, Lightning's, Accelerate's)
    *("HF_", "TRANSFORMERS_", "TOKENIZERS_", "USE_TORCH", "USE_TF", "PL_", "LIGHTNING_", "ACCELERATE_"),
)
# ... of which a framework's imports do not read the other's (Keras, which may run on either, reads both)
NOT_READ_BY = {
    "torch": ("TF_", "KERAS_"),
    "tensorflow": ("TORCH", "PYTORCH"),
    "tf_keras": ("TORCH", "PYTORCH"),
}
# ... but not these: a rank takes its thread budget after the fork (``warm.fork_server``), and its
# own sys.path and streams
TAKEN_AFTER_FORK = (*THREAD_VARS, "TF_NUM_INTEROP_THREADS", "PYTHONPATH", "PYTHONUNBUFFERED")
# The interpreter's own are PYTHONHASHSEED, PYTHONWARNINGS...: no underscore after PYTHON, but for
# these (3.13's); others with one are no interpreter's (Spark gives each executor's Python workers
# a PYTHON_WORKER_FACTORY_SECRET of its own, which would have kept a server per executor)
INTERPRETER_UNDERSCORED = (
    "PYTHON_GIL",
    "PYTHON_JIT",
    "PYTHON_CPU_COUNT",
    "PYTHON_FROZEN_MODULES",
    "PYTHON_PRESITE",
)
IDLE_SECONDS = 600.0  # a preloader without a request for so long ends
PRELOADER = "hvd_magic.warm.preloader"
READY_SECONDS = 120.0  # the preloader's imports, on a loaded machine


def forked_server(
    modules: tuple[str, ...], environment: Mapping[str, str], identity: str, path: str, keeper: int
) -> int | None:
    """The pid of a fork server listening at ``path`` and kept by ``keeper``, forked from the
    preloader of ``identity`` (started, with ``environment``, if none listens); None where there
    is no preloader (the caller starts a server itself)."""
    base = shared_base()
    if base is None:
        return None
    name = f"preloader-{hashlib.sha256(identity.encode()).hexdigest()[:32]}"
    folder = os.path.join(base, name)
    with open(os.path.join(base, f"{name}.lock"), "a") as lock:
        if not locked(lock, READY_SECONDS):
            return None
        if listening(folder) is None and not _start(modules, environment, folder):
            return None
        return _ask(os.path.join(folder, "socket"), path, keeper)


def _start(modules: tuple[str, ...], environment: Mapping[str, str], folder: str) -> bool:
    """A preloader in ``folder``, listening once this returns True."""
    shutil.rmtree(folder, ignore_errors=True)  # one killed before it could remove it
    os.mkdir(folder, 0o700)
    argv = [sys.executable, "-m", PRELOADER, str(IDLE_SECONDS), os.path.join(folder, "socket"), *modules]
    with open(os.path.join(folder, "log"), "ab") as log:
        starter = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=dict(environment),
            cwd=folder, start_new_session=True,
        )  # fmt: skip
    said: list[bytes] = []
    stdout = starter.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: said.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(READY_SECONDS)
    stdout.close()
    starter.wait()  # the preloader forked away from it at once
    if said == [b"ready\n"]:
        return True
    pid = listening(folder)
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    shutil.rmtree(folder, ignore_errors=True)
    return False


def _ask(preloader: str, path: str, keeper: int) -> int | None:
    """The pid of the server the preloader at ``preloader`` forked for ``path`` and ``keeper``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.settimeout(READY_SECONDS)
            conn.connect(preloader)
            conn.sendall(json.dumps({"socket": path, "keeper": keeper}).encode())
            pid = json.loads(conn.recv(1 << 12)).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) else None


def shared_base() -> str | None:
    """This user's folder of shared servers (0700), or None where it is not this user's alone."""
    base = os.path.join(tempfile.gettempdir(), f"hvd_magic-servers-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    found = os.lstat(base)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None
    return base


def locked(lock: IO[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def listening(folder: str) -> int | None:
    """The pid of the server (or preloader) of ``folder`` if it is there (its socket is in place
    once it listens)."""
    try:
        with open(os.path.join(folder, "pid")) as note:
            pid = int(note.read())
        alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        return pid if alive and os.path.exists(os.path.join(folder, "socket")) else None
    except (OSError, ValueError, psutil.Error):
        return None


def remove_ended(base: str) -> None:
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


def read_at_import(modules: tuple[str, ...], env: Mapping[str, str]) -> dict[str, str]:
    """The variables of the ranks' environment (this process's, and the run's ``env`` over it)
    that ``modules``, their OpenMP and the interpreter may read at import: a rank forked later
    would not see another value of one (``TF_USE_LEGACY_KERAS``, say)."""
    roots = [module.split(".")[0] for module in modules if not module.startswith("hvd_magic")]
    if roots:
        unread = set.intersection(*(set(NOT_READ_BY.get(root, ())) for root in roots))
        prefixes = tuple(prefix for prefix in IMPORT_VARIABLES if prefix not in unread)
    else:  # our own modules only (ranks of no framework): what the interpreter reads
        prefixes = INTERPRETER_VARIABLES
    merged = os.environ | dict(env)
    return {
        name: value
        for name, value in merged.items()
        if name.startswith(prefixes)
        and name not in TAKEN_AFTER_FORK
        and (not name.startswith("PYTHON_") or name in INTERPRETER_UNDERSCORED)
    }


def identity(modules: tuple[str, ...], env: Mapping[str, str]) -> str:
    """What a server for ranks of ``env`` imports, as it would import it: the interpreter, the
    modules, their files' times and the variables the imports read. A server serves where this
    is its own."""
    return json.dumps(
        [sys.executable, modules, _installed(modules), read_at_import(modules, env)], sort_keys=True
    )


def _installed(modules: tuple[str, ...]) -> dict[str, tuple[str, float]]:
    """Where each preloaded package is found, and when its files last changed (a reinstall
    changes them; another kernel's path may find another copy). hvd_magic's own: the newest of
    its modules (an edit in a checkout changes no ``__init__``; some 200 files, a millisecond)."""
    found = {}
    for name in {module.split(".")[0] for module in modules}:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            with contextlib.suppress(OSError):
                found[name] = (
                    spec.origin,
                    _newest(spec.origin) if name == "hvd_magic" else os.stat(spec.origin).st_mtime,
                )
    return found


def _newest(origin: str) -> float:
    """The last time a module of the package whose ``__init__`` is ``origin`` changed."""
    newest = 0.0
    for folder, _, files in os.walk(os.path.dirname(origin)):
        for file in files:
            if file.endswith(".py"):
                with contextlib.suppress(OSError):
                    newest = max(newest, os.stat(os.path.join(folder, file)).st_mtime)
    return newest
