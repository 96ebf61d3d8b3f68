"""What a kernel's run endpoint and the Jupyter server's Horovod panel say to each other (issue 78).

A kernel that ran a run serves its record (``run.endpoint``) on a ZeroMQ ``ipc://`` socket in
a folder that only its user may enter (mode 0700), and writes an *endpoint file* (mode 0600) in
``<runtime>/hvd-magic/`` (mode 0700), ``<runtime>`` being the runtime folder of the server that
started the kernel (where its connection file is): the socket's address, a token made for
this kernel, its process id and its kernel id. The server extension (``hvd_magic.server``) finds the files,
and asks with the token; a request without it is answered with a refusal and nothing else.

A request is one JSON object: ``{"token": ..., "ask": "runs" | "run" | "stop" | "stacks" |
"timeline", "number": N, "at_once": bool, "until": T}`` (a timeline's: ``"version"``, the one the
tab shows, or ``"window"``, the viewer's request for a window's detail; ``until``: the time, in
seconds since the epoch, after which the asker no longer waits for the answer, so a kernel that
reaches the request later refuses it rather than act on it); the answer is one JSON object, with
``"refused"`` (why) when refused.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["ASKS", "Endpoint", "endpoint_folder", "read_endpoints"]

ASKS = ("runs", "run", "stop", "stacks", "timeline")
FOLDER = "hvd-magic"  # in the Jupyter server's runtime folder


def endpoint_folder(runtime_dir: str | os.PathLike[str]) -> Path:
    """``<runtime_dir>/hvd-magic``."""
    return Path(runtime_dir) / FOLDER


@dataclass(frozen=True)
class Endpoint:
    """Where one kernel's run record is served, and the token it asks for."""

    address: str  # ipc://<a folder of its own>/runs.sock
    token: str
    pid: int
    kernel: str  # the Jupyter kernel's id; "pid-<pid>" in an IPython with no kernel around it

    @property
    def file(self) -> str:
        return f"{self.kernel}.json"

    def remove_socket(self) -> None:
        """The socket and its folder (a kernel killed leaves them behind)."""
        path = Path(self.address.removeprefix("ipc://"))
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()

    def write(self, folder: Path) -> Path:
        """The endpoint file, created with mode 0600 (never readable by another user, not even
        for a moment)."""
        path = folder / self.file
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(asdict(self), out)
        return path


def read_endpoints(folder: Path) -> list[Endpoint]:
    """The endpoint files in ``folder`` whose kernel process still lives (a dead kernel's file is
    left behind only when it was killed; it is removed here)."""
    import psutil

    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            endpoint = Endpoint(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours
        if psutil.pid_exists(endpoint.pid):
            found.append(endpoint)
        else:
            path.unlink(missing_ok=True)
            endpoint.remove_socket()
    return found


def refusal(text: str) -> dict[str, Any]:
    return {"refused": text}
