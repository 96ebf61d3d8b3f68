"""``hvd_magic.report()``: a no-op outside a run; inside one, batched, bounded, never blocking."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import hvd_magic
from hvd_magic.protocol import Kind, Reports
from hvd_magic.rank import collective_time, reporting

WAIT = 10.0  # generous bound for the background flusher on a busy machine


class FakeClient:
    """Records ``send(record, blob)``; ``answers`` scripts the return values (then True)."""

    def __init__(self, answers: list[bool] | None = None) -> None:
        self.sent: list[tuple[Any, bytes]] = []
        self.answers = list(answers or [])
        self.lock = threading.Lock()
        self.got_one = threading.Event()

    def send(self, record: Any, blob: bytes = b"") -> bool:
        with self.lock:
            self.sent.append((record, blob))
            ok = self.answers.pop(0) if self.answers else True
        self.got_one.set()
        return ok

    def delivered(self) -> list[tuple[Reports, list[dict[str, Any]]]]:
        """The sends that succeeded, as (record, decoded records)."""
        with self.lock:
            sent = list(self.sent)
        return [(record, json.loads(blob)) for record, blob in sent]


@pytest.fixture(autouse=True)
def _always_detach() -> Iterator[None]:
    reporting.detach()  # a leftover from elsewhere must not leak in
    try:
        yield
    finally:
        reporting.detach()


@pytest.fixture
def no_flusher(monkeypatch: pytest.MonkeyPatch) -> None:
    # The background thread waits FLUSH_SECONDS between flushes: make that never, so only
    # explicit flushes and _detach() send.
    monkeypatch.setattr(reporting, "FLUSH_SECONDS", 3600.0)


def attach(client: FakeClient) -> reporting.Reporter:
    """Attach ``client`` as the run's channel; the reporter that now buffers the records."""
    reporter = reporting.attach(client)  # type: ignore[arg-type]
    assert reporting.current() is reporter
    return reporter


def test_report_outside_a_run_does_nothing() -> None:
    assert reporting.current() is None
    hvd_magic.report(step=1, total=10, epoch=0, loss=0.5)
    reporting.report()
    assert reporting.current() is None
    reporting.detach()  # detaching with nothing attached is harmless too
    assert reporting.current() is None


def test_public_report_is_the_reporting_function() -> None:
    assert hvd_magic.report is reporting.report


@pytest.fixture
def no_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whether horovod.torch was imported into this process (by another test) must not matter.
    monkeypatch.setattr(collective_time, "waited", lambda: None)


def test_records_are_batched_as_json_in_one_message(no_flusher: None, no_collectives: None) -> None:
    client = FakeClient()
    reporting.attach(client)  # type: ignore[arg-type]
    reporting.report(step=1, total=3, epoch=0, loss=0.5, acc=1)
    reporting.report(step=2)
    reporting.report(lr=0.01)
    assert client.sent == []  # buffered, not sent per call
    reporting.detach()

    assert len(client.sent) == 1
    record, blob = client.sent[0]
    assert isinstance(record, Reports)
    assert record.KIND is Kind.REPORTS
    assert record.dropped == 0
    records = json.loads(blob)
    assert [{k: v for k, v in r.items() if k != "t"} for r in records] == [
        {"step": 1, "total": 3, "epoch": 0, "metrics": {"loss": 0.5, "acc": 1.0}},
        {"step": 2},
        {"metrics": {"lr": 0.01}},
    ]
    assert all(isinstance(r["t"], float) for r in records)
    assert isinstance(records[0]["metrics"]["acc"], float)


def test_values_are_coerced_to_numbers(no_flusher: None) -> None:
    client = FakeClient()
    reporting.attach(client)  # type: ignore[arg-type]
    reporting.report(step=2.0, total="5", loss="0.25")  # type: ignore[arg-type]
    reporting.detach()
    [(_, records)] = client.delivered()
    assert records[0]["step"] == 2 and isinstance(records[0]["step"], int)
    assert records[0]["total"] == 5
    assert records[0]["metrics"] == {"loss": 0.25}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"loss": None}, "each metric is one number .*; not loss \\(NoneType\\)"),
        ({"loss": [1.0, 2.0]}, "each metric is one number .*; not loss \\(list\\)"),
        ({"step": "ten"}, "step must be a whole number, got 'ten'"),
        ({"step": float("nan")}, "step must be a whole number, got nan"),
        ({"step": 2.7}, "step must be a whole number, got 2.7"),
        ({"epoch": "x"}, "epoch must be a whole number"),
    ],
)
def test_a_value_that_is_no_number_is_named(no_flusher: None, given: dict[str, Any], said: str) -> None:
    """They raised from inside hvd_magic without a name (TypeError, ValueError), or 2.7 was cut to step 2."""
    reporting.attach(FakeClient())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=f"hvd_magic.report\\(\\): {said}"):
        reporting.report(**given)


def test_background_thread_flushes_without_detach() -> None:
    client = FakeClient()
    reporting.attach(client)  # type: ignore[arg-type]
    reporting.report(step=7)
    assert client.got_one.wait(WAIT), "the flusher never sent the buffered record"
    [(record, records)] = client.delivered()
    assert record.dropped == 0
    assert records[0]["step"] == 7


def test_nothing_is_sent_when_nothing_was_reported(no_flusher: None) -> None:
    client = FakeClient()
    reporting.attach(client)  # type: ignore[arg-type]
    reporting.detach()
    assert client.sent == []


def test_full_buffer_drops_and_counts(no_flusher: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting, "BUFFER_LIMIT", 3)
    client = FakeClient()
    reporting.attach(client)  # type: ignore[arg-type]
    for step in range(1, 6):
        reporting.report(step=step)  # never blocks: 4 and 5 are dropped
    reporter = reporting.current()
    assert reporter is not None
    assert len(reporter.buffer) == 3
    assert reporter.dropped == 2
    reporter.flush()

    [(record, records)] = client.delivered()
    assert record.dropped == 2
    assert [r["step"] for r in records] == [1, 2, 3]  # the oldest are kept

    # The buffer has room again; the count is cumulative, so the next message still says 2.
    reporting.report(step=6)
    reporting.detach()
    assert len(client.sent) == 2
    record, records = client.delivered()[1]
    assert record.dropped == 2
    assert [r["step"] for r in records] == [6]


def test_drop_count_grows_across_batches(no_flusher: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting, "BUFFER_LIMIT", 2)
    client = FakeClient()
    reporter = attach(client)
    for step in range(4):
        reporting.report(step=step)
    reporter.flush()
    for step in range(5):
        reporting.report(step=step)
    reporting.detach()
    assert [record.dropped for record, _ in client.delivered()] == [2, 5]


def test_refused_send_counts_the_batch_as_dropped(no_flusher: None) -> None:
    client = FakeClient(answers=[False])  # the client's send queue is full once
    reporter = attach(client)
    for step in range(3):
        reporting.report(step=step)
    reporter.flush()
    assert reporter.dropped == 3
    assert reporter.buffer == []  # not retried: the records are gone, only counted

    reporting.report(step=99)
    reporting.detach()
    assert len(client.sent) == 2
    record, records = client.delivered()[1]
    assert record.dropped == 3
    assert [r["step"] for r in records] == [99]


def test_detach_flushes_what_is_left(no_flusher: None) -> None:
    client = FakeClient()
    reporting.attach(client)  # type: ignore[arg-type]
    for step in range(10):
        reporting.report(step=step)
    assert client.sent == []
    reporting.detach()
    assert reporting.current() is None
    [(_, records)] = client.delivered()
    assert [r["step"] for r in records] == list(range(10))
    reporting.report(step=11)  # after the run: a no-op again
    assert len(client.sent) == 1


def test_detach_stops_the_background_thread(no_flusher: None) -> None:
    client = FakeClient()
    reporter = attach(client)
    assert reporter.running
    reporting.detach()
    assert not reporter.running


def test_concurrent_reports_are_all_accounted_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting, "FLUSH_SECONDS", 0.001)  # flusher races the writers
    monkeypatch.setattr(reporting, "BUFFER_LIMIT", 50)
    client = FakeClient(answers=[True, False] * 20)
    reporter = attach(client)
    threads, per_thread = 4, 500
    start = threading.Barrier(threads)

    def writer() -> None:
        start.wait(WAIT)
        for step in range(per_thread):
            reporting.report(step=step)

    workers = [threading.Thread(target=writer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT)
        assert not worker.is_alive()
    reporting.detach()

    with client.lock:
        sent = list(client.sent)
    refused = {i for i in range(len(sent)) if i < 40 and i % 2 == 1}  # sends answered False
    delivered = sum(len(json.loads(blob)) for i, (_, blob) in enumerate(sent) if i not in refused)
    # Every report was either delivered or counted as dropped, exactly once.
    assert delivered + reporter.dropped == threads * per_thread
    counts = [record.dropped for record, _ in sent]
    assert counts == sorted(counts)  # cumulative: never goes down
    assert counts[-1] <= reporter.dropped


def test_a_step_carries_the_seconds_waited_in_collectives_where_measured(
    no_flusher: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collective_time, "waited", lambda: 1.25)
    client = FakeClient()
    reporting.attach(client)  # type: ignore[arg-type]
    reporting.report(step=1, loss=0.5)
    reporting.report(lr=0.01)  # no step: nothing to time against
    reporting.detach()
    records = json.loads(client.sent[0][1])
    assert [r.get("w") for r in records] == [1.25, None]
