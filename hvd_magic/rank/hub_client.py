"""A rank's (or a Spark task's) end of the wire: the connection to the notebook's hub.

ZeroMQ with CURVE: the keys come from the run's token (``hub.RunKeys.client_token``), handed over
in the environment, never on a command line. The connection is watched: when the notebook's
process dies its sockets close, and ``lost_for`` says so within moments, where missed beats take
20 s (a network that is cut closes nothing: that is left to the beats).
"""

from __future__ import annotations

import dataclasses
import select
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from hvd_magic.protocol import Hello, Message, Payload, Record, decode, encode

__all__ = ["LOST_SECONDS", "HubClient"]

LOST_SECONDS = 1.0  # a connection closed this long, and not made again: the notebook is gone
RELOOK_SECONDS = 0.05  # the longest a receive waits before it looks at the socket again


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
        self._monitor_lock = threading.Lock()
        watched = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
        self._monitor = self._socket.get_monitor_socket(watched)
        self._lost_at: float | None = None
        self._socket.connect(address)
        self._waiter = select.poll()  # on ZeroMQ's descriptor: readable when there is news
        self._waiter.register(self._socket.fileno(), select.POLLIN)

    def send(self, record: Record, blob: bytes = b"") -> bool:
        """Queue one message; returns False (and drops it) if the send queue is full or the client
        was closed: a thread that outlives its task's client (output still coming, a py-spy dump
        still being taken) ends quietly instead of raising."""
        frames = encode(record, self.rank, blob)
        with self._lock:
            if self._socket.closed:
                return False
            try:
                self._socket.send_multipart(frames, zmq.NOBLOCK)
                return True
            except zmq.Again:
                return False

    def receive(self, timeout: float) -> Message | None:
        """The next message from the server, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            # The lock is held only to look and take, never to wait: a thread that sends (a
            # task's exit, a rank's output) gets the socket within microseconds, not after
            # the waits of a receiving loop that took the lock back first (sockets are not
            # thread-safe).
            with self._lock:
                if self._socket.closed:
                    return None
                if self._socket.poll(0, zmq.POLLIN):
                    message = decode(self._socket.recv_multipart())
                    if message is not None:
                        return message
                    continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # ZeroMQ's descriptor says "look again", edge-triggered: an edge a sending thread
            # consumed is caught by the next look, RELOOK_SECONDS on at most.
            try:
                self._waiter.poll(1e3 * min(left, RELOOK_SECONDS))
            except OSError:  # closed by another thread: said by the next look
                time.sleep(min(left, RELOOK_SECONDS))

    def ask(self, request: Record, blob: bytes, timeout: float) -> Message:
        """Send a request (a record with an ``id``) and wait for the answer with the same id;
        one request at a time."""
        with self._ask_lock:
            if self.closed:  # no answer can come: not a wait until the timeout
                raise ConnectionError("the connection to the notebook's hub was closed")
            self._asked += 1
            self.send(dataclasses.replace(request, id=self._asked), blob)  # type: ignore[type-var]
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                answer = self.receive(left)
                if answer is not None and getattr(answer.record, "id", None) == self._asked:
                    return answer
            raise TimeoutError(f"no answer from the notebook's hub within {timeout:.0f} s")

    def fetch_payload(self, timeout: float) -> bytes:
        """Say hello and wait for the run's payload."""
        self.send(Hello())
        answer = self.receive(timeout)
        if answer is None:
            raise TimeoutError(f"no answer from the notebook's hub within {timeout:.0f} s")
        if not isinstance(answer.record, Payload):
            raise ConnectionError(f"unexpected answer from the hub: {answer.kind.value!r}")
        return answer.blob

    @property
    def closed(self) -> bool:
        """Whether ``close`` ran: a send is then dropped."""
        return bool(self._socket.closed)

    def lost_for(self) -> float:
        """Seconds since the connection to the notebook was closed by its end (its process gone)
        without being made again; 0 while it stands (or was never made)."""
        with self._monitor_lock:
            while self._monitor.poll(0):
                event = recv_monitor_message(self._monitor)["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    self._lost_at = self._lost_at or time.monotonic()
                elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._lost_at = None
            return 0.0 if self._lost_at is None else time.monotonic() - self._lost_at

    def close(self) -> None:
        with self._monitor_lock:
            self._monitor.close(linger=0)
        with self._lock:
            self._socket.close()
        self._context.term()
