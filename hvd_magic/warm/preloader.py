"""The per-user preloader, the process fork servers are forked from: it imports the frameworks
once for every fork server of a kernel of this user on this machine that would import them
alike, so that a server starts in milliseconds instead of importing them anew (PyTorch 3.5
CPU-seconds, TensorFlow 7): a kernel restarted, or a second notebook, starts its ranks warm from
the first cell.

    python -m hvd_magic.warm.preloader IDLE SOCKET MODULE...

Its peers are authenticated as a fork server's are (a folder of the user's only, ``SO_PEERCRED``).
A request names the new server's socket and its keeper (``warm.preloaders``); the child becomes
that server, as one started with ``--keeper`` is (``warm.fork_server``): it ends with its keeper, not
with the preloader, and shows that command line. The preloader is kept by no one: it leaves its
starter's tree at once, and ends, its folder with it, when no request came for IDLE seconds (or
within seconds of its folder's removal).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys

from hvd_magic.warm.fork_server import serve_forever
from hvd_magic.warm.forked_rank import join_groups_of, show_as
from hvd_magic.warm.serving import (
    Request,
    accept_and_fork,
    check_peer,
    end_with,
    import_frozen,
    listen,
    remove_and_exit,
)

__all__ = ["SERVER", "detach", "preloader"]

SERVER = "hvd_magic.warm.fork_server"
PRELOADER = "hvd_magic.warm.preloader"
MAX_REQUEST = 1 << 12
LOOK_SECONDS = 5.0  # how often an idle preloader looks at its folder and its idle time


def preloader(path: str, modules: list[str], idle: float) -> None:
    """A preloader: imports ``modules`` once, then forks a fork server for each request (its
    socket and keeper), which serves as one started with ``--keeper`` would. It is no child of
    whoever started it (``detach``), and ends once no request came for ``idle``
    seconds and no one holds its lock (``FOLDER.lock``: a client asking for a server holds it)."""
    folder = os.path.dirname(path)
    import_frozen(modules)
    listener = listen(path)
    with open(os.path.join(folder, "pid"), "w") as note:
        note.write(str(os.getpid()))
    print("ready", flush=True)
    os.dup2(2, 1)  # its stderr is its log: the starter's pipe is not written to again
    listener.settimeout(min(idle, LOOK_SECONDS))

    def looked(idle_for: float) -> None:
        if not os.path.exists(path):  # its folder removed (its TMPDIR's, say): no one finds it
            os._exit(0)
        if idle_for >= idle and _unclaimed(f"{folder}.lock"):
            remove_and_exit(folder)

    def become_server(conn: socket.socket, request: Request) -> None:
        _become_server(conn, request.asked["socket"], request.asked["keeper"], modules)

    accept_and_fork(listener, _server_request, become_server, "fork server preloader", idle=looked)


def _server_request(conn: socket.socket) -> Request:
    """A preloader's request: where the new server listens, and whose end it ends with."""
    peer = check_peer(conn)
    request = json.loads(conn.recv(MAX_REQUEST))
    if not isinstance(request, dict):
        raise ValueError("not a request for a server (its socket and keeper)")
    path, keeper = request.get("socket"), request.get("keeper")
    if not (isinstance(path, str) and os.path.isabs(path) and os.path.isdir(os.path.dirname(path))):
        raise ValueError(f"no folder for a server's socket at {path!r}")
    if not (isinstance(keeper, int) and keeper > 0):
        raise ValueError(f"not a keeper's pid: {keeper!r}")
    return Request({"socket": path, "keeper": keeper}, peer)


def _become_server(conn: socket.socket, path: str, keeper: int, modules: list[str]) -> None:
    """The preloader's child: a fork server kept by ``keeper``, writing to the log in its own
    folder and shown as one started with ``--keeper`` is; it answers the request with its pid."""
    folder = os.path.dirname(path)
    log = os.open(os.path.join(folder, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(folder)
    join_groups_of(keeper)  # accounted with its kernel, as a server the kernel started would be
    show_as([sys.executable, "-m", SERVER, "--keeper", str(keeper), path, *modules])
    listener = listen(path)
    end_with(listener, keeper)
    conn.sendall(json.dumps({"pid": os.getpid()}).encode())
    conn.close()
    serve_forever(listener, folder)


def _unclaimed(lock: str) -> bool:
    """Whether no client holds the preloader's lock; if so, it is held from now on (to the end)."""
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    return True


def detach(argv: list[str]) -> None:
    """Leaves the starter's tree: forks (the starter reaps this process, which ends at once), and
    the child, a child of no one's, runs the preloader anew as ``--detached`` (a fresh interpreter,
    whose own start a tool that watches processes, coverage.py say, sees)."""
    if os.fork() > 0:
        os._exit(0)
    os.execv(sys.executable, [sys.executable, "-m", PRELOADER, "--detached", *argv])


if __name__ == "__main__":
    if sys.argv[1] == "--detached":
        preloader(sys.argv[3], sys.argv[4:], idle=float(sys.argv[2]))
    else:
        detach(sys.argv[1:])
