"""A live session's rank and the notebook's interrupt (its SIGINT handler, as the rank runs it):
an interrupt that lands while a message is being sent is taken again once it is sent."""

from __future__ import annotations

import signal
import sys
import threading
from types import SimpleNamespace

from hvd_magic.hub import RunKeys
from hvd_magic.protocol import Log
from hvd_magic.rank import session_loop
from hvd_magic.rank.hub_client import HubClient


def test_an_interrupt_between_a_messages_frames_is_taken_again_after_it():
    """pyzmq sends a message's frames one by one: a KeyboardInterrupt between two of them left
    half a message, glued to the next one sent (the cell's error), and both were dropped."""
    client = HubClient("tcp://127.0.0.1:9", RunKeys.generate().client_token(), rank=0)
    handle = session_loop._sigint_handler(SimpleNamespace(interrupting=0, busy=0))  # type: ignore[arg-type]
    retaken = threading.Event()
    sent: list[list[bytes]] = []

    class Socket:  # the rank's socket, where the interrupt lands mid-message
        closed = False

        def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
            handle(signal.SIGINT, sys._getframe())
            sent.append(frames)

    previous = signal.signal(signal.SIGINT, lambda *_: retaken.set())
    real, client._socket = client._socket, Socket()
    try:
        assert client.send(Log("stdout"), b"a line\n") and len(sent) == 1  # sent whole
        assert retaken.wait(30)  # and the interrupt taken again after it
    finally:
        signal.signal(signal.SIGINT, previous)
        client._socket = real
        client.close()
