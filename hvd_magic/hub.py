"""The notebook's endpoint that ranks and Spark tasks report to (their end is ``rank.hub_client``).

Transport is ZeroMQ with CURVE: every run gets a fresh server key pair and a fresh client key
pair. A server only completes the handshake with a peer that holds the run's client secret key
(checked by a ZAP handler), so a connection without the run's keys never delivers a message.
Traffic is encrypted too, which matters when executors report across a cluster network.

Messages are ``protocol`` records (see its table). A rank's first message is ``Hello``; the hub
answers it with the payload. Spark tasks use the same channel for their rendezvous (``Join``,
answered by ``Plan``) and to relay their ranks' Gloo store requests (``StoreRequest``, answered
on the hub's thread by a responder).
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import zmq
from zmq.auth.thread import ThreadAuthenticator

from hvd_magic.protocol import CONTROL_RECORDS, Hello, Message, Payload, RankStatus, Record, decode, encode

__all__ = ["CurveServer", "Hub", "Replies", "RunKeys"]

POLL_MS = 200  # how often the hub's loop looks at its stop flag when nothing comes (close wakes it)
Responder = Callable[[Message], tuple[Record, bytes]]
Tap = Callable[[Message], "Message | None"]
_question_ids = itertools.count(1)


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

    Subclasses implement ``handle(message)``; any thread may call ``send_to``.
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

    def send_to(self, identity: bytes, record: Record, blob: bytes = b"") -> None:
        self._outbox.put([identity, *encode(record, blob=blob)])
        with self._wake_lock:
            if not self._stop.is_set():
                self._wake_out.send(b"")

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(POLL_MS))
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
            message = decode(frames[1:], identity=frames[0]) if frames else None
            if message is None:
                continue
            try:
                self.handle(message)
            except Exception as err:  # noqa: BLE001 (the one thread every rank's messages come by lives on)
                print(
                    f"hvd_magic: {self._thread.name} could not handle rank {message.rank}'s "
                    f"{type(message.record).__name__}: {type(err).__name__}: {err}",
                    file=sys.stderr,
                )

    def handle(self, message: Message) -> None:
        raise NotImplementedError

    def close(self) -> None:
        with self._wake_lock:
            self._stop.set()
            self._wake_out.send(b"")  # the loop ends now, not at its next poll's timeout
        self._thread.join(timeout=5)
        for sock in (self._socket, self._wake_in, self._wake_out):
            sock.close(linger=0)
        self._auth.stop()
        self._context.term()


class Hub(CurveServer):
    """Receives rank messages and queues them for the run loop; answers ``Hello`` with the payload.

    What Spark tasks tell their launcher (``CONTROL_RECORDS``) goes to ``control`` instead of
    ``events``; a record type in ``responders`` is answered at once, on the hub's thread; one in
    ``taps`` is handed to its tap there first, which returns what to queue (itself, another
    message, or None for nothing): a live session learns its ranks' connections that way.

    >>> hub = Hub("127.0.0.1", payload=b"...")      # doctest: +SKIP
    >>> hub.address, hub.keys.client_token()          # handed to the ranks
    >>> message = hub.events.get(timeout=1)
    """

    def __init__(self, bind_host: str, payload: bytes) -> None:
        self.events: queue.Queue[Message] = queue.Queue()
        self.control: queue.Queue[Message] = queue.Queue()
        self.payload = payload
        self.responders: dict[type[Record], Responder] = {}
        self.taps: dict[type[Record], Tap] = {}
        self.inboxes: dict[int, bytes] = {}  # each rank's receiving connection (its RankStatus's)
        self.replies: dict[type[Record], Replies] = {}  # Replies.of: one per answer type
        super().__init__(bind_host, RunKeys.generate(), "hvd_magic-hub")

    def tell_all(self, record: Record) -> None:
        """Send ``record`` to every rank's inbox that introduced itself."""
        for identity in list(self.inboxes.values()):
            self.send_to(identity, record)

    def handle(self, message: Message) -> None:
        responder = self.responders.get(type(message.record))
        if responder is not None:
            self.send_to(message.identity, *responder(message))
            return
        if isinstance(message.record, Hello):
            self.send_to(message.identity, Payload(), self.payload)
        elif isinstance(message.record, RankStatus):
            self.inboxes[message.rank] = message.identity
        tap = self.taps.get(type(message.record))
        if tap is not None:
            tapped = tap(message)
            if tapped is None:
                return
            message = tapped
        (self.control if isinstance(message.record, CONTROL_RECORDS) else self.events).put(message)


class Replies:
    """The answers to a question the notebook asks over a hub (each rank's stacks, each Spark
    task's native dumps), gathered on the hub's thread by the question's ``id``: one per hub and
    answer type (``Replies.of``); an answer that comes after its question's wait is dropped."""

    def __init__(self, hub: Hub, answer: type[Record]) -> None:
        self._answers: dict[int, list[Message]] = {}
        self._arrived = threading.Condition()
        hub.taps[answer] = self._tap

    @classmethod
    def of(cls, hub: Hub, answer: type[Record]) -> Replies:
        if answer not in hub.replies:
            hub.replies[answer] = cls(hub, answer)
        return hub.replies[answer]

    def _tap(self, message: Message) -> None:
        with self._arrived:
            answers = self._answers.get(int(cast(Any, message.record).id))
            if answers is not None:
                answers.append(message)
                self._arrived.notify_all()

    def ask(
        self, send: Callable[[int], object], enough: Callable[[list[Message]], bool], timeout: float
    ) -> list[Message]:
        """``send(id)`` asks; the answers to that id, once ``enough`` of them came or ``timeout``
        seconds passed."""
        asked = next(_question_ids)
        with self._arrived:
            self._answers[asked] = []
        send(asked)
        with self._arrived:
            self._arrived.wait_for(lambda: enough(self._answers[asked]), timeout)
            return self._answers.pop(asked)
