"""``hvd_magic.report(step=..., total=..., **metrics)``: progress and metrics from a rank.

Cheap and never blocking: outside a ``%%horovod`` run it does nothing; inside one it appends the
record to a bounded buffer that a background thread sends to the notebook ten times a second,
as one message. When the buffer is full the record is dropped and counted, never waited for.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from hvd_magic.protocol import FileChunk, Reports
from hvd_magic.rank import collective_time

if TYPE_CHECKING:
    from hvd_magic.rank.hub_client import HubClient

__all__ = ["Reporter", "attach", "current", "detach", "report", "send_file", "send_file_soon"]

FLUSH_SECONDS = 0.1
BUFFER_LIMIT = 20_000


class Reporter:
    """Batches a rank's reports (a flush a tenth of a second) and sends its files, one at a time."""

    def __init__(self, client: HubClient) -> None:
        self.client = client
        self.buffer: list[dict[str, Any]] = []
        self.dropped = 0
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # a flush returns once what it took is sent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hvd_magic-report", daemon=True)
        self._thread.start()
        # Files sent in the background, one at a time (a second waits for the first): a rank
        # that checkpoints does not wait for the network, and holds at most two in memory.
        self.files: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=1)
        self._sender = threading.Thread(target=self._send_files, name="hvd_magic-files", daemon=True)
        self._sender.start()

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            if len(self.buffer) >= BUFFER_LIMIT:
                self.dropped += 1
                return
            self.buffer.append(record)

    def flush(self) -> None:
        with self._sending:
            with self._lock:
                records, self.buffer = self.buffer, []
                dropped = self.dropped
            if records and not self.client.send(Reports(dropped), json.dumps(records).encode()):
                with self._lock:
                    self.dropped += len(records)

    def settle(self) -> None:
        """Send what was reported and handed over so far: a message sent after this is behind it
        on the wire (a live session's cell, then its end)."""
        self.files.join()
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            self.flush()

    def _send_files(self) -> None:
        while (item := self.files.get()) is not None:
            _send_file(self.client, *item)
            self.files.task_done()
        self.files.task_done()

    @property
    def running(self) -> bool:
        """Its flushing thread is alive (until ``close``)."""
        return self._thread.is_alive()

    def close(self) -> None:
        self.files.put(None)
        self.files.join()  # the last checkpoint arrives before the rank says it exited
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()


_reporter: Reporter | None = None


def attach(client: HubClient) -> Reporter:
    """Start reporting over ``client`` (the worker does, as a rank starts; a test may too)."""
    global _reporter
    _reporter = Reporter(client)
    return _reporter


def current() -> Reporter | None:
    """This rank's reporter inside a run (its ``client`` is the rank's connection), else None."""
    return _reporter


def detach() -> None:
    """Send what is left and stop reporting (harmless when nothing is attached)."""
    global _reporter
    reporter, _reporter = _reporter, None
    if reporter is not None:
        reporter.close()


def report(
    step: int | None = None,
    total: int | None = None,
    epoch: int | None = None,
    **metrics: float,
) -> None:
    """Report progress and metrics of this rank to the notebook's live view.

    >>> for step, batch in enumerate(loader):              # doctest: +SKIP
    ...     loss = train_step(batch)
    ...     hvd_magic.report(step=step + 1, total=len(loader), loss=loss)

    ``step``/``total`` drive the progress bar, ``epoch`` is shown beside it, every other
    keyword is a metric curve. Outside a ``%%horovod`` run this does nothing.
    """
    reporter = _reporter
    if reporter is None:
        return
    record: dict[str, Any] = {"t": time.time()}
    if step is not None:
        record["step"] = _whole("step", step)
        waited = collective_time.waited()
        if waited is not None:
            record["w"] = round(waited, 6)  # its own time is "t" less this (see stragglers)
    if total is not None:
        record["total"] = _whole("total", total)
    if epoch is not None:
        record["epoch"] = _whole("epoch", epoch)
    if metrics:
        try:
            record["metrics"] = {name: float(value) for name, value in metrics.items()}
        except (TypeError, ValueError):
            raise _not_numbers(metrics) from None
    reporter.add(record)


def _whole(name: str, value: Any) -> int:
    """``value`` as a whole number, or a TypeError that names it (2.7 was cut to 2, nan raised
    from int())."""
    try:
        whole = int(value)
    except (TypeError, ValueError, OverflowError):
        whole = None
    if whole is None or (isinstance(value, float) and value != whole):
        raise TypeError(f"hvd_magic.report(): {name} must be a whole number, got {value!r}") from None
    return whole


def _not_numbers(metrics: dict[str, Any]) -> TypeError:
    """The metrics that are no number (None, a list, a tensor of many values), named."""
    bad = []
    for name, value in metrics.items():
        try:
            float(value)
        except (TypeError, ValueError):
            bad.append(f"{name} ({type(value).__name__})")
    return TypeError(
        "hvd_magic.report(): each metric is one number (a float, an int, a one-value tensor); "
        f"not {', '.join(bad)}"
    )


FILE_CHUNK_BYTES = 4 * 1024 * 1024


def send_file(name: str, data: bytes) -> bool:
    """Send ``data`` to the notebook as the file ``name`` (rank 0 only; the run decides where it
    is written, e.g. an estimator's model_dir). False outside a run or on another rank."""
    reporter = _reporter
    if reporter is None or reporter.client.rank != 0:
        return False
    _send_file(reporter.client, name, data)
    return True


def send_file_soon(name: str, data: bytes) -> bool:
    """``send_file``, from a background thread: returns once the previous such file is on its
    way (the bytes are the caller's snapshot, taken before the call)."""
    reporter = _reporter
    if reporter is None or reporter.client.rank != 0:
        return False
    reporter.files.put((name, data))
    return True


def _send_file(client: HubClient, name: str, data: bytes) -> None:
    view = memoryview(data)
    for start in range(0, max(len(data), 1), FILE_CHUNK_BYTES):
        last = start + FILE_CHUNK_BYTES >= len(data)
        while not client.send(FileChunk(name, last=last), bytes(view[start : start + FILE_CHUNK_BYTES])):
            if client.closed:  # the rank is ending: no one to send to
                return
            time.sleep(0.01)  # the send queue is full: a file must arrive whole
