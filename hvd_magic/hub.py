"""The driver-side endpoint that ranks report to, and the client ranks use to reach it.

Transport is ZeroMQ with CURVE: every run gets a fresh server key pair and a fresh client key
pair. The hub only completes the handshake with a peer that holds the run's client secret key
(checked by a ZAP handler), so a connection without the run's keys never delivers a message.
Traffic is encrypted too, which matters when executors report across a cluster network.

A message is three frames: kind, a JSON header and an optional binary blob (pickled values,
raw log bytes). The first message of a rank is ``hello``; the hub answers it with the payload.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

__all__ = ["Event", "Hub", "HubClient", "RunKeys"]

_POLL_MS = 50


@dataclass(frozen=True)
class RunKeys:
    """The CURVE keys of one run; ``encode()`` is the secret handed to ranks (never on argv)."""

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
        """What a rank needs to connect: server public key and the client key pair."""
        return b",".join([self.server_public, self.client_public, self.client_secret]).decode()


@dataclass
class Event:
    kind: str
    rank: int
    header: dict[str, Any] = field(default_factory=dict)
    blob: bytes = b""
    received: float = field(default_factory=time.monotonic)


class _ClientKeyCheck:
    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed
        self.refused = 0

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key == self.allowed  # both z85-encoded
        if not ok:
            self.refused += 1
        return ok


class Hub:
    """Receives rank events on a background thread and queues them for the run loop.

    >>> hub = Hub("127.0.0.1", payload=b"...")      # doctest: +SKIP
    >>> hub.address, hub.keys.client_token()          # handed to the ranks
    >>> event = hub.events.get(timeout=1)
    """

    def __init__(self, bind_host: str, payload: bytes) -> None:
        self.keys = RunKeys.generate()
        self.events: queue.Queue[Event] = queue.Queue()
        self.payload = payload
        self._context = zmq.Context()
        self._auth = ThreadAuthenticator(self._context)
        self._auth.start()
        self._key_check = _ClientKeyCheck(self.keys.client_public)
        self._auth.configure_curve_callback(domain="*", credentials_provider=self._key_check)
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.curve_server = True
        self._socket.curve_publickey = self.keys.server_public
        self._socket.curve_secretkey = self.keys.server_secret
        self._socket.linger = 0
        port = self._socket.bind_to_random_port(f"tcp://{bind_host}")
        self.address = f"tcp://{bind_host}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hvd_magic-hub", daemon=True)
        self._thread.start()

    @property
    def refused_handshakes(self) -> int:
        return self._key_check.refused

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(_POLL_MS):
                continue
            while True:
                try:
                    frames = self._socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._handle(frames)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) not in (3, 4):
            return
        identity, kind_raw, header_raw = frames[:3]
        blob = frames[3] if len(frames) == 4 else b""
        try:
            header = json.loads(header_raw)
            kind = kind_raw.decode()
            rank = int(header.get("rank", -1))
        except (ValueError, UnicodeDecodeError, AttributeError):
            return
        if kind == "hello":
            self._socket.send_multipart([identity, b"payload", self.payload])
        self.events.put(Event(kind, rank, header, blob))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close(linger=0)
        self._auth.stop()
        self._context.term()


class HubClient:
    """A rank's connection to the hub. Thread-safe; ``send`` never blocks for long."""

    def __init__(self, address: str, token: str, rank: int) -> None:
        server_public, client_public, client_secret = token.encode().split(b",")
        self.rank = rank
        self._lock = threading.Lock()
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

    def fetch_payload(self, timeout: float) -> bytes:
        """Say hello and wait for the run's payload."""
        self.send("hello")
        if not self._socket.poll(int(timeout * 1000), zmq.POLLIN):
            raise TimeoutError(f"no answer from the notebook's hub within {timeout:.0f} s")
        kind, payload = self._socket.recv_multipart()
        if kind != b"payload":
            raise ConnectionError(f"unexpected answer from the hub: {kind!r}")
        return payload

    def close(self) -> None:
        with self._lock:
            self._socket.close()
        self._context.term()
