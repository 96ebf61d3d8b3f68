"""Warm ranks: one process imports the framework once (PyTorch, TensorFlow or Keras; each rank
imports Horovod's binding itself), then forks every rank from itself, so that a rank starts in
milliseconds instead of importing it anew (1.5 to 6 CPU-seconds a rank).

    python -m hvd_magic.rank.forkserver SOCKET MODULE...     # stdin: held open by the notebook
    python -m hvd_magic.rank.forkserver --keeper PID SOCKET MODULE...   # shared: ends with PID

A server may also be forked from a *template* that imported the modules already (``template``),
and is then the same as one started with ``--keeper``, its command line too.

A launcher starts ``forked.py SOCKET`` where it would start the rank (``mpirun`` runs it, or the
launcher itself): that stand-in hands its standard streams, environment and directory over the
socket and stands for the rank until it ends (see ``forked``). Here, for each stand-in:

- a *waiter* is forked, which forks the rank, tells the stand-in the rank's pid, waits for the
  rank and tells it how the rank ended (a signal too);
- the rank takes the stand-in's place and runs ``hvd_magic.rank.worker`` (``forked_rank``).

Peers are authenticated by the kernel: the socket's folder is the user's only (0700), a peer of
another user id is refused (``SO_PEERCRED``). The server ends when the notebook closes its stdin
or dies, or (``--keeper``: shared by an executor's Python workers) when the executor's Python
daemon ends, and removes its folder. Its socket is there once it listens. It must never touch a
GPU or start a thread before forking: neither a CUDA context nor a lock held by another thread
would survive into the ranks.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import gc
import importlib
import json
import os
import shutil
import signal
import socket
import struct
import sys
from typing import Any

from hvd_magic.protocol.files import forked_rank_file
from hvd_magic.protocol.lifetime import wait_for_end_of
from hvd_magic.rank.forked_rank import WORKER, become_rank

__all__ = [
    "check_peer",
    "cuda_initialized",
    "end_with",
    "import_frozen",
    "listen",
    "receive",
    "remove_and_exit",
    "serve",
    "serve_forever",
]

MAX_REQUEST = 1 << 20  # one stand-in's environment and directory, as JSON
STREAMS = 3  # stdin, stdout, stderr


def receive(conn: socket.socket) -> tuple[dict[str, Any], list[int], int]:
    """One stand-in's request, its three streams and its pid; ``PermissionError`` for a peer of
    another user."""
    pid = check_peer(conn)
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(STREAMS * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    request = json.loads(data) if len(fds) == STREAMS else None
    env, cwd = (request.get("env"), request.get("cwd")) if isinstance(request, dict) else (None, None)
    if not (isinstance(cwd, str) and isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        for fd in fds:
            os.close(fd)
        raise ValueError("not a stand-in's request (its environment, directory and three streams)")
    return {"env": env, "cwd": cwd}, list(fds), pid


def check_peer(conn: socket.socket) -> int:
    """The peer's pid; ``PermissionError`` for a peer of another user."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.getuid():
        raise PermissionError(f"peer of user {uid}")
    return int(pid)


def serve(path: str, modules: list[str], keeper: int | None = None) -> None:
    import_frozen(modules)
    listener = listen(path)
    end_with(listener, keeper)
    print("ready", flush=True)
    serve_forever(listener, os.path.dirname(path))


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


def serve_forever(listener: socket.socket, folder: str) -> None:
    while True:
        conn, _ = listener.accept()
        try:
            request, fds, stand_in = receive(conn)
        except (OSError, ValueError) as err:
            print(f"hvd_magic fork server: refused a request: {err}", file=sys.stderr, flush=True)
            conn.close()
            continue
        if os.fork() == 0:
            try:  # a child never returns into this loop, whatever happens in it
                listener.close()
                _wait_for_rank(conn, request, fds, stand_in, folder)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        conn.close()


def import_frozen(modules: list[str]) -> None:
    """Imports ``modules`` with the collector off (an import makes objects to keep: collections
    walk them for nothing), then freezes what is left: no rank's collection walks it, nor writes
    to its pages, which would copy each of them into the rank."""
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


CUDA_ERROR_NOT_INITIALIZED = 3


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


def remove_and_exit(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


def _wait_for_rank(
    conn: socket.socket, request: dict[str, Any], fds: list[int], stand_in: int, folder: str
) -> None:
    """The waiter: forks the rank, then tells the stand-in its pid and, once it ended, how; the
    rank's pid is noted in the server's ``folder`` meanwhile (``protocol.files.forked_rank_file``),
    before the rank goes on: whoever asks the launcher which ranks are its own finds it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's folder is the server's to remove
    from hvd_magic.protocol.lifetime import die_with_parent

    die_with_parent()  # the server gone, the waiter goes (and the rank with it)
    noted, note_written = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(note_written)
            os.read(noted, 1)  # until the note is written (or the waiter is gone, and this with it)
            become_rank(conn, request, fds, stand_in)  # ends the process
        finally:
            os._exit(1)
    for fd in [*fds, noted]:
        os.close(fd)
    written = forked_rank_file(folder, stand_in)
    try:
        try:
            with open(written, "w") as note:
                note.write(str(pid))
        finally:
            os.close(note_written)  # the rank goes on
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        conn.sendall(json.dumps({"status": status}).encode() + b"\n")
    except OSError:
        pass  # the stand-in is gone: the rank sees it too and ends
    finally:
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.remove(written)
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "--keeper":
        serve(sys.argv[3], sys.argv[4:], keeper=int(sys.argv[2]))
    else:
        serve(sys.argv[1], sys.argv[2:])
