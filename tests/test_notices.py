"""The clouds' preemption notices as each rank reads them: against a local HTTP server that
answers as each metadata service does (its paths, the headers it requires, before and after a
notice). A whole run stopped by a notice is in test_retry."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hvd_magic.protocol import ENV_PREEMPTION
from hvd_magic.protocol.env import preemption_error
from hvd_magic.rank import notices


class Metadata(BaseHTTPRequestHandler):
    """EC2 (IMDSv2), Compute Engine and Azure's metadata, with or without a notice."""

    noticed = False
    azure_answer: str | None = None  # an odd answer of Azure's, where set

    def _answer(self, status: int, body: str = "") -> None:
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._answer(200, "token-1") if self.path == "/latest/api/token" and ttl else self._answer(400)

    def do_GET(self) -> None:  # noqa: N802
        noticed = type(self).noticed
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
                return self._answer(401)
            action = {"action": "terminate", "time": "2026-11-27T10:00:00Z"}
            return self._answer(200, json.dumps(action)) if noticed else self._answer(404)
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._answer(403)
            return self._answer(200, "TRUE" if noticed else "FALSE")
        if self.path.startswith("/metadata/scheduledevents"):
            if self.headers.get("Metadata") != "true":
                return self._answer(400)
            if type(self).azure_answer is not None:
                return self._answer(200, type(self).azure_answer)
            events = (
                [{"EventType": "Preempt", "NotBefore": "Fri, 27 Nov 2026 10:00:00 GMT"}] if noticed else []
            )
            return self._answer(200, json.dumps({"DocumentIncarnation": 1, "Events": events}))
        return self._answer(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def metadata(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Metadata]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(notices, "AWS", f"{base}/latest")
    monkeypatch.setattr(notices, "GCP", f"{base}/computeMetadata/v1/instance/preempted")
    monkeypatch.setattr(notices, "AZURE", f"{base}/metadata/scheduledevents?api-version=2020-07-01")
    Metadata.noticed, Metadata.azure_answer = False, None
    yield Metadata
    server.shutdown()


@pytest.mark.parametrize(
    ("cloud", "said"),
    [
        ("aws", 'AWS spot interruption notice: {"action": "terminate"'),
        ("gcp", "Compute Engine is preempting this VM"),
        ("azure", "Azure scheduled event: Preempt at Fri, 27 Nov 2026 10:00:00 GMT"),
    ],
)
def test_each_clouds_notice_is_read_only_once_it_is_there(metadata, monkeypatch, cloud, said):
    monkeypatch.setenv(ENV_PREEMPTION, cloud)
    look = notices.watcher()
    assert look is not None and look() is None  # no notice yet
    metadata.noticed = True
    assert (look() or "").startswith(said)


def test_no_metadata_service_is_no_notice(monkeypatch):
    monkeypatch.setattr(notices, "GCP", "http://127.0.0.1:9/preempted")  # nothing listens
    monkeypatch.setenv(ENV_PREEMPTION, "gcp")
    look = notices.watcher()
    assert look is not None and look() is None


def test_a_file_notice_and_what_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "notice"
    monkeypatch.setenv(ENV_PREEMPTION, f"file:{path}")
    look = notices.watcher()
    assert look is not None and look() is None
    path.write_text("")
    assert look() == f"{path} appeared"
    monkeypatch.delenv(ENV_PREEMPTION)
    assert notices.watcher() is None
    assert preemption_error("AWS") is None and preemption_error(f"file:{path}") is None
    assert "say where each rank looks" in (preemption_error("file:") or "")


@pytest.mark.parametrize("answer", ['{"Events": null}', "[]", '{"Events": ["soon"]}', '{"Events": 3}'])
def test_an_odd_answer_of_azures_is_no_notice(metadata, monkeypatch, answer):
    """It raised (TypeError, AttributeError) and ended the rank's watch for good."""
    monkeypatch.setenv(ENV_PREEMPTION, "azure")
    metadata.azure_answer = answer
    assert notices.azure() is None


def test_the_watch_goes_on_after_a_look_that_failed_and_tells_the_first_notice(tmp_path, monkeypatch):
    """One look that raised (a notice file's bytes that are not UTF-8 once did) ended the watch:
    no notice after it reached the notebook."""
    path = tmp_path / "notice"
    path.write_bytes(b"\xff\xfe reclaimed")
    monkeypatch.setenv(ENV_PREEMPTION, f"file:{path}")
    assert "reclaimed" in (notices.watcher()() or "")  # read, whatever its bytes
    looks = iter([RuntimeError("a metadata service's odd answer"), None, "reclaimed in 2 minutes"])

    def look():
        said = next(looks)
        if isinstance(said, Exception):
            raise said
        return said

    class Client:
        def __init__(self) -> None:
            self.told: queue.Queue[object] = queue.Queue()

        def send(self, record: object) -> bool:
            self.told.put(record)
            return True

    monkeypatch.setattr(notices, "watcher", lambda: look)
    monkeypatch.setattr(notices, "FILE_LOOK_SECONDS", 0.01)
    client = Client()
    notices.watch(client)  # type: ignore[arg-type]
    assert client.told.get(timeout=30).text == "reclaimed in 2 minutes"
