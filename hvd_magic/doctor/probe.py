"""What runs outside the notebook's process for ``doctor``: ``python -m hvd_magic.doctor.probe FRAMEWORK``
imports Horovod's binding in a fresh process (a broken build cannot take the kernel down), and
``executor_report`` runs on Spark executors.

Self-contained on purpose: ``executor_report`` is pickled by value, so an executor whose Python
lacks hvd_magic (the very thing being checked) can still run it. Only the standard library here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import socket
import sys

BINDINGS = {"torch": "horovod.torch", "tensorflow": "horovod.tensorflow"}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def binding_report(framework: str) -> dict[str, object]:
    """Whether Horovod's binding for ``framework`` imports here, and what it was built with."""
    try:
        binding = importlib.import_module(BINDINGS[framework])
    except Exception as err:  # noqa: BLE001 - what went wrong is the report
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        return {"imports": False, "problem": f"{type(err).__name__}: {lines[-1] if lines else ''}"}
    built = {name: bool(getattr(binding, f"{name}_built")()) for name in ("mpi", "gloo", "nccl")}
    return {"imports": True, "problem": "", **built}


def executor_report(token: str, address: str, timeout: float, _row: object = None) -> str:
    """One executor's Python and packages, and whether it reaches the notebook at ``address``
    (``host:port``; the listener answers only a peer that sends ``token``). JSON text."""
    report: dict[str, object] = {
        "host": socket.gethostname(),
        "executable": sys.executable,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "hvd_magic": _version("hvd_magic"),
        "horovod": _version("horovod"),
        "reach": "",
    }
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as connection:
            connection.settimeout(timeout)
            connection.sendall(token.encode() + b"\n")
            if connection.recv(16) != b"ok\n":
                report["reach"] = "the listener did not accept this executor's token"
    except OSError as err:
        report["reach"] = f"{type(err).__name__}: {err}"
    return json.dumps(report)


if __name__ == "__main__":
    print(json.dumps(binding_report(sys.argv[1])))
