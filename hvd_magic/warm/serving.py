"""What the two server processes of warm ranks share: the per-user preloader (``warm.preloader``)
and the per-kernel or per-executor fork server (``warm.fork_server``). Each imports its modules
once (frozen), listens on a Unix socket in a folder of the user's only, refuses a peer of
another user (``SO_PEERCRED``), and forks a child for each request it takes, in one loop
(``accept_and_fork``). Neither may touch a GPU or start a thread before forking: neither a CUDA
context nor a lock held by another thread would survive into the child.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import shutil
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hvd_magic.protocol.env import WORKER
from hvd_magic.protocol.lifetime import wait_for_end_of

__all__ = [
    "Request",
    "accept_and_fork",
    "check_peer",
    "cuda_initialized",
    "end_with",
    "import_frozen",
    "listen",
    "remove_and_exit",
]

CUDA_ERROR_NOT_INITIALIZED = 3


@dataclass
class Request:
    """A request a server took: what it asks, the file descriptors that came with it (a stand-in's
    streams: the child's, closed in the server once forked) and the peer's pid."""

    asked: dict[str, Any]
    peer: int
    fds: list[int] = field(default_factory=list)


def accept_and_fork(
    listener: socket.socket,
    take: Callable[[socket.socket], Request],
    child: Callable[[socket.socket, Request], None],
    server: str,
    idle: Callable[[float], None] | None = None,
) -> NoReturn:
    """Serves for ever: each connection's request taken (``take``; whatever it raises: refused,
    and said in the server's log), then a child forked that runs ``child`` and never
    comes back into this loop. ``idle`` (where the listener has a timeout): called with the
    seconds since the last request whenever none came within the timeout."""
    last = time.monotonic()
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if idle is not None:
                idle(time.monotonic() - last)
            continue
        last = time.monotonic()
        try:
            request = take(conn)
        except Exception as err:  # noqa: BLE001 - a bad request is refused; the server goes on
            print(f"hvd_magic {server}: refused a request: {err}", file=sys.stderr, flush=True)
            conn.close()
            continue
        if os.fork() == 0:
            try:  # a child never returns into this loop, whatever happens in it
                listener.close()
                child(conn, request)
            finally:
                os._exit(1)
        for fd in request.fds:
            os.close(fd)
        conn.close()


def check_peer(conn: socket.socket) -> int:
    """The peer's pid; ``PermissionError`` for a peer of another user."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.getuid():
        raise PermissionError(f"peer of user {uid}")
    return int(pid)


def listen(path: str) -> socket.socket:
    """The server's socket at ``path``, there once it listens; a SIGTERM removes its folder."""
    sys.modules.pop(WORKER, None)  # its imports stay; the module itself runs anew, as ``__main__``
    if cuda_initialized():
        raise SystemExit("hvd_magic fork server: importing the framework started CUDA; not forking")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message, one request
    listener.bind(f"{path}.new")
    listener.listen(64)
    os.rename(f"{path}.new", path)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # what it forks: reaped by the kernel
    # Its end removes its folder: a shared server's has no one else to, and the kernel that
    # started a server of its own may have died (the server then ends at its stdin's end)
    signal.signal(signal.SIGTERM, lambda *_: remove_and_exit(os.path.dirname(path)))
    return listener


def import_frozen(modules: list[str]) -> None:
    """Imports ``modules`` with the collector off (an import makes objects to keep: collections
    walk them for nothing), then freezes what is left: no child's collection walks it, nor writes
    to its pages, which would copy each of them into the child."""
    gc.disable()
    for index, name in enumerate(modules):
        try:
            importlib.import_module(name)
        except ImportError:  # a module of a framework imported above (torch._dynamo): where it has it
            if not any(name.startswith(f"{before}.") for before in modules[:index]):
                raise
    gc.collect()
    gc.freeze()
    gc.enable()


def cuda_initialized() -> bool:
    """Whether this process has set up NVIDIA's driver (``cuInit``), whatever framework did: a
    fork's child could not use it. Asked only of a driver already loaded, never loading one."""
    try:
        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return False  # not loaded: not set up
    context = ctypes.c_void_p()
    return bool(driver.cuCtxGetCurrent(ctypes.byref(context)) != CUDA_ERROR_NOT_INITIALIZED)


def end_with(server: socket.socket, keeper: int | None) -> None:
    """The server ends at the end of its stdin (closed, or the notebook died), or of its keeper's
    process. A process of its own watches it, so that the server itself never has a second thread."""
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        server.close()
        if keeper is None:
            while sys.stdin.buffer.read(1 << 16):
                pass
        else:
            wait_for_end_of(keeper)
        os.kill(os.getppid(), signal.SIGTERM)
        os._exit(0)
    nothing = os.open(os.devnull, os.O_RDONLY)  # fd 0 stays taken: a stand-in's streams come above 2
    os.dup2(nothing, 0)
    os.close(nothing)


def remove_and_exit(folder: str) -> NoReturn:
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)
