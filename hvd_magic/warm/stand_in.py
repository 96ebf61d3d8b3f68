"""The stand-in a launcher starts for a warm rank: ``python -I .../forked.py [SOCKET]`` (without
SOCKET, the variable ``HVD_MAGIC_FORK_SERVER`` names it: mpirun on Spark starts one command on
every host, and each host's server has a socket of its own).

It hands its place (standard streams, environment, directory) to the fork server at SOCKET,
which forks the rank from a process that has imported the framework already (``forkserver``);
then it stands where the rank would stand in its launcher's tree, under ``mpirun`` or the
notebook: the signals it gets (Ctrl-C, a stop) go on to the rank, and it ends as the rank ends,
with its exit code or by its signal, so that the launcher reads the rank's end from it.
Its own end (even a SIGKILL) ends the rank. Where the server cannot take it (gone, refusing), it
becomes the rank itself, started the usual way.

Run by path, not as a module: it imports only the standard library, so it starts in
milliseconds.
"""

from __future__ import annotations

import array
import ctypes
import json
import os
import signal
import socket
import sys

FORK_SERVER = "HVD_MAGIC_FORK_SERVER"  # protocol.env.ENV_FORK_SERVER, not imported (see below)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def die_with_parent() -> None:
    """SIGKILL this process when its launcher ends, as every process of a run does
    (``hvd_magic.protocol.lifetime``, not imported here: it would load the package)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def hand_over(path: str) -> socket.socket | None:
    env = {name: value for name, value in os.environ.items() if name != FORK_SERVER}
    request = {"env": env, "cwd": os.getcwd()}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        streams = array.array("i", [0, 1, 2])
        conn.sendmsg([json.dumps(request).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, streams)])
    except OSError:
        conn.close()
        return None
    return conn


def started_the_usual_way() -> None:
    os.environ.pop(FORK_SERVER, None)
    os.execv(sys.executable, [sys.executable, "-m", "hvd_magic.rank.worker"])


def main() -> None:
    die_with_parent()
    if os.getppid() == 1:  # the launcher is already gone
        os._exit(1)
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(FORK_SERVER, "")
    conn = hand_over(path) if path else None
    if conn is None:
        started_the_usual_way()
        return
    reply = conn.recv(4096)
    if not reply:  # the server took the request but could not fork: nothing started
        conn.close()
        started_the_usual_way()
        return
    rank = int(json.loads(reply)["pid"])
    for number in FORWARDED:
        signal.signal(number, lambda received, _frame: os.kill(rank, received))
    reply = conn.recv(4096)  # until the rank ended (a signal's handler runs, then this goes on)
    status = int(json.loads(reply)["status"]) if reply else signal.SIGKILL  # the waiter gone: as if killed
    if os.WIFSIGNALED(status):
        ended_by = os.WTERMSIG(status)
        if ended_by not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught anyway
            signal.signal(ended_by, signal.SIG_DFL)
        os.kill(os.getpid(), ended_by)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
