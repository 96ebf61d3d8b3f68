"""A rank forked by the fork server (``fork_server``) takes the place of its stand-in (``stand_in``):
its streams, environment, directory, CPU affinity and cgroups; random seeds drawn afresh and its
framework's threads set from its launch's budget; then it runs ``hvd_magic.rank.worker`` as
``python -m`` would, shown under that command line, and dies with the stand-in."""

from __future__ import annotations

import ctypes
import io
import os
import runpy
import signal
import socket
import sys
import threading
from typing import Any

from hvd_magic.protocol.env import WORKER

__all__ = ["become_rank", "join_groups_of", "show_as"]


def become_rank(conn: socket.socket, request: dict[str, Any], fds: list[int], stand_in: int) -> None:
    os.setsid()  # out of the server's group: a signal meant for it is not the rank's
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(  # as Python's own stderr: what cannot be encoded is escaped
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
    )
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[:] = _rank_path(request["cwd"], request["env"].get("PYTHONPATH", ""))
    join_groups_of(stand_in)
    _fresh_state()
    threading.Thread(target=_die_with, args=(conn,), name="hvd_magic-stand-in", daemon=True).start()
    show_as([sys.executable, "-m", WORKER])
    sys.argv[1:] = []  # not the server's arguments: a rank's argparse sees what a started rank's would
    sys.orig_argv = [sys.executable, "-m", WORKER]
    runpy.run_module(WORKER, run_name="__main__", alter_sys=True)  # as ``python -m``: ends the process
    os._exit(1)  # not reached: the worker's ``__main__`` ends the process


def _rank_path(cwd: str, pythonpath: str) -> list[str]:
    """sys.path as ``python -m`` in ``cwd`` with ``pythonpath`` would have it: the directory, the
    PYTHONPATH entries, then the interpreter's own."""
    return [cwd, *(entry for entry in pythonpath.split(os.pathsep) if entry), *_BASE_PATH]


def join_groups_of(pid: int) -> None:
    """Takes the CPU affinity and cgroups of the process ``pid`` (a rank its stand-in's, a server
    forked from a preloader its keeper's): memory accounting and OOM records among them."""
    try:
        os.sched_setaffinity(0, os.sched_getaffinity(pid))
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/cgroup") as lines:
            groups = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return
    for _, controllers, path in groups:  # v1: "4:memory:/a/b"; v2: "0::/a/b"
        folder = "/sys/fs/cgroup" + (f"/{controllers.removeprefix('name=')}" if controllers else "")
        try:
            with open(os.path.join(folder + path, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        except OSError:
            pass  # not ours to move (no delegation): accounted where its parent is


def show_as(argv: list[str]) -> None:
    """What ``ps`` and psutil show as this process's command line: ``argv``, written over the
    server's own (longer) in place, as a started rank's reads (left as it is where it is longer)."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: proc(5) fields 48, 49
    except (OSError, IndexError, ValueError):
        return
    shown = "\0".join(argv).encode() + b"\0"
    if len(shown) <= end - start:
        ctypes.memmove(start, shown.ljust(end - start, b"\0"), end - start)


def _fresh_state() -> None:
    """What a fork copies that a started process would have drawn anew: random seeds; and the
    threads the framework read from the server's environment at import."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    dynamo = sys.modules.get("torch._dynamo.config")  # its debug folder: read from the directory
    if dynamo is not None and hasattr(dynamo, "default_debug_dir_root"):  # at import, the server's
        setattr(dynamo, "debug_dir_root", dynamo.default_debug_dir_root())  # noqa: B010 - a module


def _die_with(conn: socket.socket) -> None:
    """The stand-in is the rank's place in its launcher's tree: when it is gone, so is the rank."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


# the interpreter's own sys.path: without the server's directory (``-m``) and PYTHONPATH
_SERVER_PYTHONPATH = {
    os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry
}
_BASE_PATH = [entry for entry in sys.path[1:] if os.path.abspath(entry) not in _SERVER_PYTHONPATH]
