"""The clouds' preemption notices as each rank reads them: against a local HTTP server that
answers as each metadata service does (its paths, the headers it requires, before and after a
notice). A whole run stopped by a notice is in test_retry."""

from __future__ import annotations

import json
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
    Metadata.noticed = False
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
