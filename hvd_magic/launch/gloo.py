"""Horovod's Gloo controller: the rank layout, the ranks' environment, and the rendezvous store,
served on loopback to this host's own ranks only.

Gloo's C++ client speaks plain HTTP (a new connection per request) and cannot send a secret.
So no store listens on the network at all. Each host serves the store on 127.0.0.1 and
accepts a connection only if the socket at its other end belongs to a process this process
started (its descendant), checked before a byte is read: the kernel names the socket at the
other end (netlink's sock_diag, else ``/proc/net/tcp``), and ``/proc/<pid>/fd`` its owner. On
Spark, the task relays each request over its CURVE channel to the store on the driver (``Hub``
responders).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from hvd_magic.protocol import GlooSlot, Message, Record, StoreAnswer, StoreRequest
from hvd_magic.warm.servers import own_processes

__all__ = ["GlooStore", "LoopbackStoreServer", "gloo_env", "gloo_slots"]

MAX_VALUE_BYTES = 64 << 20  # Gloo stores addresses: ~150 bytes per peer per rank
STOP_POLL_SECONDS = 0.02  # how soon a closed store's thread sees its stop
Backend = Callable[[str, str, bytes], tuple[int, bytes]]


def gloo_slots(hosts: list[tuple[str, int]]) -> list[GlooSlot]:
    """Horovod's rank layout for ``(hostname, ranks there)`` pairs, in rank order, as horovodrun
    makes it: a rank's cross rank and size count the hosts that have a rank of its local rank
    (hosts of 2 and 1 ranks: local rank 1's cross size is 1; the hosts' count, it waited for a
    peer that never came)."""
    size = sum(count for _, count in hosts)
    having = [
        sum(1 for _, count in hosts if count > local)
        for local in range(max((c for _, c in hosts), default=0))
    ]
    seen = [0] * len(having)
    slots: list[GlooSlot] = []
    for group_rank, (hostname, count) in enumerate(hosts):
        for local_rank in range(count):
            cross = (seen[local_rank], having[local_rank])
            seen[local_rank] += 1
            slots.append(
                GlooSlot(hostname, len(slots), size, local_rank, count, *cross, group_rank, len(hosts))
            )
    return slots


def gloo_env(slot: GlooSlot, store_port: int, interface: str) -> dict[str, str]:
    """A rank's environment for Horovod's Gloo controller, its store on this host's loopback."""
    return slot.env() | {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(store_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": interface,
    }


class GlooStore:
    """The key-value semantics Horovod's ranks expect: ``/scope/key``, GET (404 if absent), PUT,
    DELETE. A DELETE in a planned scope (global, local_HOST, cross_N) records that rank as
    finished; when all of the scope's ranks have, the scope is cleared for the next rendezvous."""

    def __init__(self, slots: Iterable[GlooSlot]) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[str, bytes]] = {}
        self._finished: dict[str, set[str]] = {}
        self._scope_size: dict[str, int] = {}
        for slot in slots:
            self._scope_size["global"] = slot.size
            self._scope_size[f"local_{slot.hostname}"] = slot.local_size
            self._scope_size[f"cross_{slot.local_rank}"] = slot.cross_size

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Answer one request: (HTTP status, body)."""
        parts = path.split("/")
        if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
            return 400, b""
        _, scope, key = parts
        with self._lock:
            if method == "GET":
                value = self._values.get(scope, {}).get(key)
                return (404, b"") if value is None else (200, value)
            if method == "PUT":
                self._values.setdefault(scope, {})[key] = body
                return 200, b""
            if method == "DELETE":
                self._delete(scope, key)
                return 200, b""
        return 405, b""

    def answer(self, message: Message) -> tuple[Record, bytes]:
        """A hub responder: a Spark task's relayed ``StoreRequest``, answered from this store."""
        request = message.record
        assert isinstance(request, StoreRequest)
        status, value = self.request(request.method, request.path, message.blob)
        return StoreAnswer(request.id, status), value

    def _delete(self, scope: str, key: str) -> None:
        if scope in self._scope_size:
            finished = self._finished.setdefault(scope, set())
            finished.add(key)
            if len(finished) >= self._scope_size[scope]:
                self._values.pop(scope, None)
                finished.clear()
        else:  # a scope the ranks made up (process sets): drop the key
            values = self._values.get(scope, {})
            values.pop(key, None)
            if not values:
                self._values.pop(scope, None)


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): one socket looked up by its four-tuple
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST = 4, 20, 1
NO_COOKIE = ALL_STATES = 0xFFFFFFFF  # any socket cookie; TCP states: all of them
DIAG_UID_INODE = 16 + 4 + 48 + 12  # nlmsghdr, inet_diag_msg's state bytes, its sockid, 3 counters


def _proc_address(address: tuple[str, int]) -> str:
    """An IPv4 address as /proc/net/tcp prints it: the 32-bit value in host order, then the port."""
    return f"{socket.inet_aton(address[0])[::-1].hex().upper()}:{address[1]:04X}"


def _socket_of(client: tuple[str, int], server: tuple[str, int]) -> str | None:
    """The socket connected from ``client`` to ``server`` if this user owns it, as its fds show it.

    Asked of the kernel by netlink (sock_diag), which finds that one socket: /proc/net/tcp,
    read where netlink is not offered, prints every socket of the host (20 ms a connection with
    6,000 of them, against 0.02, and Gloo makes a connection per request)."""
    try:
        found = _diag_uid_inode(client, server)
    except OSError:  # no sock_diag here (a sandbox's kernel)
        found = _proc_uid_inode(client, server)
    if found is None or found[0] != os.getuid():
        return None
    return f"socket:[{found[1]}]"


def _diag_uid_inode(client: tuple[str, int], server: tuple[str, int]) -> tuple[int, int] | None:
    sockid = (
        struct.pack("!HH", client[1], server[1])
        + socket.inet_aton(client[0]).ljust(16, b"\0")
        + socket.inet_aton(server[0]).ljust(16, b"\0")
        + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE)  # any interface, any cookie
    )
    body = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, ALL_STATES) + sockid
    header = struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
        diag.sendto(header + body, (0, 0))
        answer = diag.recv(1 << 16)
    if len(answer) < DIAG_UID_INODE + 8 or struct.unpack_from("=H", answer, 4)[0] != SOCK_DIAG_BY_FAMILY:
        return None  # an error message: no such socket
    uid, inode = struct.unpack_from("=II", answer, DIAG_UID_INODE)
    return uid, inode


def _proc_uid_inode(client: tuple[str, int], server: tuple[str, int]) -> tuple[int, int] | None:
    needle = f" {_proc_address(client)} {_proc_address(server)} ".encode()
    with open("/proc/net/tcp", "rb") as table_file:
        table = table_file.read()
    start = table.find(needle)
    if start < 0:
        return None
    fields = table[start : table.find(b"\n", start)].split()
    # local, remote, state, queues, timer, retransmits, uid, timeout, inode
    return (int(fields[6]), int(fields[8])) if len(fields) >= 9 else None


def _owner_of(target: str, candidates: Iterable[int]) -> int | None:
    """Which of ``candidates`` (pids) holds the socket ``target``."""
    for pid in candidates:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                if os.readlink(fd.path) == target:
                    return pid
        except OSError:  # gone, or not ours to read
            continue
    return None


def _started_at(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


class _Handler(http.server.BaseHTTPRequestHandler):
    server: LoopbackStoreServer
    timeout = 5.0

    def _answer(self, body: bytes = b"") -> None:
        try:
            status, value = self.server.backend(self.command, self.path, body)
        except (OSError, TimeoutError, ValueError, KeyError):  # the relay failed: Gloo retries
            status, value = 503, b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(value)))
        self.end_headers()
        self.wfile.write(value)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's names
        self._answer()

    def do_DELETE(self) -> None:  # noqa: N802
        self._answer()

    def do_PUT(self) -> None:  # noqa: N802
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.send_error(411)
            return
        if not 0 <= length <= MAX_VALUE_BYTES:
            self.send_error(413)
            return
        self._answer(self.rfile.read(length))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class LoopbackStoreServer(http.server.ThreadingHTTPServer):
    """The store on 127.0.0.1 for the ranks this process starts (its descendants, or forked for
    its stand-ins: ``warm.servers.own_processes``).

    >>> server = LoopbackStoreServer(GlooStore(slots).request)       # doctest: +SKIP
    >>> env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server.port)}
    """

    daemon_threads = True

    def __init__(self, backend: Backend) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.backend = backend
        self.port: int = self.server_address[1]
        self.refused = 0
        self._known: dict[int, float] = {}  # descendant pid -> its start time (pids get reused)
        # Its stop is seen at the next poll: at the default 0.5 s, every Gloo task on Spark held its
        # slot that long after its rank ended.
        serve = functools.partial(self.serve_forever, poll_interval=STOP_POLL_SECONDS)
        self._thread = threading.Thread(target=serve, name="hvd_magic-gloo-store", daemon=True)
        self._thread.start()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        target = _socket_of(client_address, ("127.0.0.1", self.port))
        if target is None:
            self.refused += 1
            return False
        pid = _owner_of(target, self._known)
        if pid is not None and _started_at(pid) == self._known[pid]:
            return True
        # A new rank (or a stranger): look again among all it started (warm ranks included).
        self._known = {}
        for child in own_processes():
            with contextlib.suppress(psutil.Error):
                self._known[child.pid] = child.create_time()
        if _owner_of(target, self._known) is not None:
            return True
        self.refused += 1
        return False

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
