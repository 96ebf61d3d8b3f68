"""The fork server, per kernel (local ranks) or per executor (Spark): a process that imports the
framework once (PyTorch, TensorFlow or Keras; each rank imports Horovod's binding itself), then
forks every rank from itself, so that a rank starts in milliseconds instead of importing it anew
(1.5 to 6 CPU-seconds a rank). For local ranks of no framework, it imports hvd_magic's rank side
only (Python's start and those imports: about half of such a cell's cost).

    python -m hvd_magic.warm.fork_server SOCKET MODULE...     # stdin: held open by the notebook
    python -m hvd_magic.warm.fork_server --keeper PID SOCKET MODULE...   # shared: ends with PID

A server may also be forked from the per-user *preloader* that imported the modules already
(``warm.preloader``), and is then the same as one started with ``--keeper``, its command line too.

A launcher starts ``stand_in.py SOCKET`` where it would start the rank (``mpirun`` runs it, or the
launcher itself): that stand-in hands its standard streams, environment and directory over the
socket and stands for the rank until it ends (see ``warm.stand_in``). Here, for each stand-in:

- a *waiter* is forked, which forks the rank, tells the stand-in the rank's pid, waits for the
  rank and tells it how the rank ended (a signal too);
- the rank takes the stand-in's place and runs ``hvd_magic.rank.worker`` (``warm.forked_rank``).

Peers are authenticated by the kernel: the socket's folder is the user's only (0700), a peer of
another user id is refused (``SO_PEERCRED``). The server ends when the notebook closes its stdin
or dies, or (``--keeper``: shared by an executor's Python workers) when the executor's Python
daemon ends, and removes its folder. Its socket is there once it listens. What it shares with
the preloader (the accept-and-fork loop, the frozen imports, no GPU touched before forking) is
``warm.serving``'s.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import sys

from hvd_magic.protocol.files import forked_rank_file
from hvd_magic.warm.forked_rank import become_rank
from hvd_magic.warm.serving import Request, accept_and_fork, check_peer, end_with, import_frozen, listen

__all__ = ["receive", "serve", "serve_forever"]

MAX_REQUEST = 1 << 20  # one stand-in's environment and directory, as JSON
STREAMS = 3  # stdin, stdout, stderr


def receive(conn: socket.socket) -> Request:
    """One stand-in's request (its environment and directory), its three streams and its pid;
    ``PermissionError`` for a peer of another user."""
    pid = check_peer(conn)
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(STREAMS * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    try:
        request = json.loads(data) if len(fds) == STREAMS else None
    except ValueError:
        request = None
    env, cwd = (request.get("env"), request.get("cwd")) if isinstance(request, dict) else (None, None)
    if not (isinstance(cwd, str) and isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        for fd in fds:
            os.close(fd)
        raise ValueError("not a stand-in's request (its environment, directory and three streams)")
    return Request({"env": env, "cwd": cwd}, pid, list(fds))


def serve(path: str, modules: list[str], keeper: int | None = None) -> None:
    import_frozen(modules)
    listener = listen(path)
    end_with(listener, keeper)
    print("ready", flush=True)
    serve_forever(listener, os.path.dirname(path))


def serve_forever(listener: socket.socket, folder: str) -> None:
    """Each stand-in's request: a waiter forked, which forks its rank (``_wait_for_rank``)."""
    accept_and_fork(
        listener, receive, lambda conn, request: _wait_for_rank(conn, request, folder), "fork server"
    )


def _wait_for_rank(conn: socket.socket, request: Request, folder: str) -> None:
    """The waiter: forks the rank, then tells the stand-in its pid and, once it ended, how; the
    rank's pid is noted in the server's ``folder`` meanwhile (``protocol.files.forked_rank_file``),
    before the rank goes on: whoever asks the launcher which ranks are its own finds it."""
    fds, stand_in = request.fds, request.peer
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
            become_rank(conn, request.asked, fds, stand_in)  # ends the process
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
