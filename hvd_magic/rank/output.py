"""A rank's stdout and stderr, at the file-descriptor level (so C++ and child-process output
is caught too), forwarded to the notebook's hub chunk by chunk as they are written."""

from __future__ import annotations

import os
import sys
import threading
import time

from hvd_magic.protocol import Log
from hvd_magic.protocol.env import TF_LEVEL_VARIABLE
from hvd_magic.rank.hub_client import HubClient
from hvd_magic.rank.stalls import StallFilter
from hvd_magic.rank.tf_logs import TfLogFilter, min_level

__all__ = ["OutputForwarder", "take_token"]

_CHUNK = 65536
CLOSE_SECONDS = 1.0  # after the last sync: for the pipes' end (none of the rank's own output is left)


def take_token(data: bytes, token: bytes | None) -> tuple[bytes, bytes, bool]:
    """``data`` without ``token``; the bytes held back (a part of the token at the end of
    ``data``); whether the token was found."""
    if token is None:
        return data, b"", False
    found = data.find(token)
    if found >= 0:
        return data[:found] + data[found + len(token) :], b"", True
    for keep in range(min(len(token) - 1, len(data)), 0, -1):
        if token.startswith(data[-keep:]):
            return data[:-keep], data[-keep:], False
    return data, b"", False


class OutputForwarder:
    """Points fd 1 and 2 at pipes and forwards what arrives to the hub, chunk by chunk."""

    def __init__(self, client: HubClient) -> None:
        self.client = client
        self.original_stderr = os.dup(2)
        self.threads: list[threading.Thread] = []
        self._tokens: dict[str, bytes | None] = {"stdout": None, "stderr": None}
        self._synced = {"stdout": threading.Event(), "stderr": threading.Event()}
        self._syncs = 0
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            name = f"hvd_magic-{stream}"
            thread = threading.Thread(target=self._pump, args=(read_end, stream), name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")

    def _pump(self, fd: int, stream: str) -> None:
        # Horovod's stall warnings (stderr) become Stall messages instead of log text.
        stalls = StallFilter() if stream == "stderr" else None
        tf_logs = TfLogFilter(min_level(os.environ.get(TF_LEVEL_VARIABLE)) if stream == "stderr" else 0)
        held = b""
        while chunk := os.read(fd, _CHUNK):
            chunk, held, synced = take_token(held + chunk, self._tokens[stream])
            chunk = tf_logs.feed(chunk)
            if synced:
                self._tokens[stream] = None
                chunk += tf_logs.flush()  # a sync ends what was written: nothing waits behind it
            if stalls is not None:
                chunk, found = stalls.feed(chunk)
                for stall in found:
                    self.client.send(stall)
            if chunk:
                self.client.send(Log(stream), chunk)
            if synced:
                self._synced[stream].set()
        rest = tf_logs.flush()
        if stalls is not None:
            rest = stalls.feed(rest)[0] + stalls.flush()
        if rest:
            self.client.send(Log(stream), rest)
        os.close(fd)

    def sync(self, timeout: float = 5.0) -> None:
        """Return once what was written to fd 1 and 2 so far has been sent: a message sent
        after this is behind it on the wire (a live session's cell output, then its end)."""
        sys.stdout.flush()
        sys.stderr.flush()
        self._syncs += 1
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            token = b"\x00hvd_magic-sync-%d-%d\x00" % (os.getpid(), self._syncs)
            self._synced[stream].clear()
            self._tokens[stream] = token
            os.write(fd, token)
        for event in self._synced.values():
            event.wait(timeout)

    def close(self) -> None:
        """What the rank wrote, sent; then the pipes are let go. A child the rank started may
        hold them open for ever (a helper process, a loader's workers): their end is not awaited
        beyond ``CLOSE_SECONDS`` (each rank's end waited 10 s on one)."""
        self.sync()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        deadline = time.monotonic() + CLOSE_SECONDS
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
