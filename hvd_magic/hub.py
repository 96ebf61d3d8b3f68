"""The driver-side endpoint that ranks report to, and the client ranks use to reach it.

Transport is ZeroMQ with CURVE: every run gets a fresh server key pair and a fresh client key
pair. A server only completes the handshake with a peer that holds the run's client secret key
(checked by a ZAP handler), so a connection without the run's keys never delivers a message.
Traffic is encrypted too, which matters when executors report across a cluster network.

A message is three frames: kind, a JSON header and an optional binary blob (pickled values,
raw log bytes). The first message of a rank is ``hello``; the hub answers it with the payload.
Spark tasks use the same channel for their rendezvous (``join``, answered by ``plan``) and to
relay their ranks' Gloo store requests (``store``, answered on the hub's thread by a responder).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

__all__ = ["CurveServer", "Event", "Hub", "HubClient", "RunKeys"]

_POLL_MS = 200
CONTROL_KINDS = frozenset({"join", "launcher_log", "launcher_exit"})
Responder = Callable[["Event"], tuple[str, dict[str, Any], bytes]]


@dataclass(frozen=True)
class RunKeys:
    """The CURVE keys of one run; ``client_token()`` is the secret handed to peers (never argv)."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def generate(cls) -> RunKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret)

    def client_token(self) -> str:
        """What a peer needs to connect: server public key and the client key pair (z85, ',')."""
        return b",".join([self.server_public, self.client_public, self.client_secret]).decode()


@dataclass
class Event:
    kind: str
    rank: int
    header: dict[str, Any] = field(default_factory=dict)
    blob: bytes = b""
    received: float = field(default_factory=time.monotonic)
    identity: bytes = b""


class _ClientKeyCheck:
    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed
        self.refused = 0

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key == self.allowed  # both z85-encoded
        if not ok:
            self.refused += 1
        return ok


class CurveServer:
    """A ROUTER socket that only talks to holders of ``keys``, served on its own thread.

    Subclasses implement ``handle(event)``; any thread may call ``send_to``.
    """

    def __init__(self, bind_host: str, keys: RunKeys, name: str) -> None:
        self.keys = keys
        self._context = zmq.Context()
        self._auth = ThreadAuthenticator(self._context)
        self._auth.start()
        self._key_check = _ClientKeyCheck(keys.client_public)
        self._auth.configure_curve_callback(domain="*", credentials_provider=self._key_check)
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.curve_server = True
        self._socket.curve_publickey = keys.server_public
        self._socket.curve_secretkey = keys.server_secret
        self._socket.linger = 0
        port = self._socket.bind_to_random_port(f"tcp://{bind_host}")
        self.address = f"tcp://{bind_host}:{port}"
        # Replies from other threads go through an outbox; an inproc socket wakes the loop.
        self._outbox: queue.Queue[list[bytes]] = queue.Queue()
        wake_address = f"inproc://wake-{id(self)}"
        self._wake_in = self._context.socket(zmq.PULL)
        self._wake_in.bind(wake_address)
        self._wake_out = self._context.socket(zmq.PUSH)
        self._wake_out.connect(wake_address)
        self._wake_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def refused_handshakes(self) -> int:
        return self._key_check.refused

    def send_to(
        self, identity: bytes, kind: str, header: dict[str, Any] | None = None, blob: bytes = b""
    ) -> None:
        self._outbox.put([identity, kind.encode(), json.dumps(header or {}).encode(), blob])
        with self._wake_lock:
            if not self._stop.is_set():
                self._wake_out.send(b"")

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(_POLL_MS))
            if self._wake_in in ready:
                while self._wake_in.poll(0):
                    self._wake_in.recv()
            while not self._outbox.empty():
                self._socket.send_multipart(self._outbox.get_nowait())
            if self._socket in ready:
                self._receive_all()

    def _receive_all(self) -> None:
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = _parse(frames)
            if event is not None:
                self.handle(event)

    def handle(self, event: Event) -> None:
        raise NotImplementedError

    def close(self) -> None:
        with self._wake_lock:
            self._stop.set()
        self._thread.join(timeout=5)
        for sock in (self._socket, self._wake_in, self._wake_out):
            sock.close(linger=0)
        self._auth.stop()
        self._context.term()


def _parse(frames: list[bytes]) -> Event | None:
    if len(frames) not in (3, 4):
        return None
    identity, kind_raw, header_raw = frames[:3]
    try:
        header = json.loads(header_raw)
        kind = kind_raw.decode()
        rank = int(header.get("rank", -1))
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
        return None
    return Event(kind, rank, header, frames[3] if len(frames) == 4 else b"", identity=identity)


class Hub(CurveServer):
    """Receives rank events and queues them for the run loop; answers ``hello`` with the payload.

    Launch-control messages from Spark tasks go to ``control`` instead of ``events``; a kind
    in ``responders`` is answered at once, on the hub's thread, by its function.

    >>> hub = Hub("127.0.0.1", payload=b"...")      # doctest: +SKIP
    >>> hub.address, hub.keys.client_token()          # handed to the ranks
    >>> event = hub.events.get(timeout=1)
    """

    def __init__(self, bind_host: str, payload: bytes) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.control: queue.Queue[Event] = queue.Queue()
        self.payload = payload
        self.responders: dict[str, Responder] = {}
        super().__init__(bind_host, RunKeys.generate(), "hvd_magic-hub")

    def handle(self, event: Event) -> None:
        responder = self.responders.get(event.kind)
        if responder is not None:
            self.send_to(event.identity, *responder(event))
            return
        if event.kind == "hello":
            self.send_to(event.identity, "payload", {}, self.payload)
        (self.control if event.kind in CONTROL_KINDS else self.events).put(event)


class HubClient:
    """A peer's connection to a ``CurveServer``. Thread-safe; ``send`` never blocks for long."""

    def __init__(self, address: str, token: str, rank: int) -> None:
        server_public, client_public, client_secret = token.encode().split(b",")
        self.rank = rank
        self._lock = threading.Lock()
        self._ask_lock = threading.Lock()
        self._asked = 0
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.curve_serverkey = server_public
        self._socket.curve_publickey = client_public
        self._socket.curve_secretkey = client_secret
        self._socket.sndhwm = 100_000
        self._socket.linger = 10_000  # deliver the last messages (result, error) before exit
        self._socket.connect(address)

    def send(self, kind: str, header: dict[str, Any] | None = None, blob: bytes | None = None) -> bool:
        """Queue one message; returns False (and drops it) if the send queue is full."""
        frames = [kind.encode(), json.dumps({"rank": self.rank, **(header or {})}).encode()]
        if blob is not None:
            frames.append(blob)
        with self._lock:
            try:
                self._socket.send_multipart(frames, zmq.NOBLOCK)
                return True
            except zmq.Again:
                return False

    def receive(self, timeout: float) -> tuple[str, dict[str, Any], bytes] | None:
        """The next message from the server, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            # Poll in slices so other threads can send in between (sockets are not thread-safe).
            with self._lock:
                if self._socket.poll(50, zmq.POLLIN):
                    kind, header, blob = self._socket.recv_multipart()
                    return kind.decode(), json.loads(header), blob
            if time.monotonic() >= deadline:
                return None

    def ask(
        self, kind: str, header: dict[str, Any], blob: bytes, timeout: float
    ) -> tuple[str, dict[str, Any], bytes]:
        """Send a request and wait for its answer (matched by id; one request at a time)."""
        with self._ask_lock:
            self._asked += 1
            self.send(kind, header | {"id": self._asked}, blob)
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                answer = self.receive(left)
                if answer is not None and answer[1].get("id") == self._asked:
                    return answer
            raise TimeoutError(f"no answer from the notebook's hub within {timeout:.0f} s")

    def fetch_payload(self, timeout: float) -> bytes:
        """Say hello and wait for the run's payload."""
        self.send("hello")
        answer = self.receive(timeout)
        if answer is None:
            raise TimeoutError(f"no answer from the notebook's hub within {timeout:.0f} s")
        if answer[0] != "payload":
            raise ConnectionError(f"unexpected answer from the hub: {answer[0]!r}")
        return answer[2]

    def close(self) -> None:
        with self._lock:
            self._socket.close()
        self._context.term()
