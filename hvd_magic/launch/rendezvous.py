"""Horovod's Gloo rendezvous store, served only to the hosts of the run.

Gloo's C++ client speaks plain HTTP to this key-value store and cannot send a secret, so the
store cannot check one. It does the next best thing: it binds to the one interface the ranks
need (loopback for local runs) and closes connections from any address outside the run's
plan before reading a byte.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["start_rendezvous"]


def start_rendezvous(bind_ip: str, allowed: set[str], slots: list[Any]) -> Any:
    """Start the store for ``slots`` (Horovod SlotInfo); returns the server (``server_address``)."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    class AllowListServer(RendezvousHTTPServer):
        refused = 0

        def verify_request(self, request: Any, client_address: tuple[str, int]) -> bool:
            if client_address[0] in allowed:
                return True
            AllowListServer.refused += 1
            return False

    server = AllowListServer((bind_ip, 0), RendezvousHandler, 0)
    server.init(slots)
    threading.Thread(target=server.serve_forever, name="hvd_magic-rendezvous", daemon=True).start()
    return server
