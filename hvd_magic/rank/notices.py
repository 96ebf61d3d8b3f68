"""Preemption notices read on a rank's own machine: a cloud's spot or preemptible VM says it
is about to be taken a minute or two ahead, on a local metadata URL only that VM can reach.

``HVD_MAGIC_PREEMPTION`` (in the notebook, or a cell's ``env=``) names where to look:

- ``aws``: EC2's spot instance-action (IMDSv2), present two minutes before an interruption;
- ``gcp``: Compute Engine's ``instance/preempted``, ``TRUE`` once the VM is being preempted;
- ``azure``: the scheduled events of the VM, a ``Preempt`` or ``Terminate`` event;
- ``file:PATH``: a file that appears (what a node's own agent writes; also for tests).

Each rank's inbox thread looks every ``LOOK_SECONDS`` (a file, which costs nothing to look at,
every ``FILE_LOOK_SECONDS``) and tells the notebook once, which then
asks every rank to checkpoint at its next ``hvd_magic.stopping()``, as for Spark's decommission.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import urllib.request
from collections.abc import Callable

from hvd_magic.protocol import ENV_PREEMPTION, Noticed
from hvd_magic.rank.hub_client import HubClient

__all__ = ["FILE_LOOK_SECONDS", "LOOK_SECONDS", "watch", "watcher"]

LOOK_SECONDS = 5.0  # a metadata service: a request each time
FILE_LOOK_SECONDS = 0.5  # a file: whether it is there, on this machine's own disk
_TIMEOUT = 2.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # link-local: never a proxy
AWS = "http://169.254.169.254/latest"
GCP = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"
AZURE = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"


def _get(url: str, headers: dict[str, str], method: str = "GET") -> str | None:
    """The answer's body, or None for no answer or an error status (no notice)."""
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with _DIRECT.open(request, timeout=_TIMEOUT) as answer:
            return str(answer.read().decode("utf-8", "replace"))
    except (OSError, ValueError, http.client.HTTPException):  # (a body cut short: IncompleteRead)
        return None


def aws() -> str | None:
    token = _get(f"{AWS}/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, "PUT")
    headers = {"X-aws-ec2-metadata-token": token} if token else {}
    action = _get(f"{AWS}/meta-data/spot/instance-action", headers)  # 404 until a notice
    return f"AWS spot interruption notice: {action.strip()}" if action else None


def gcp() -> str | None:
    answer = _get(GCP, {"Metadata-Flavor": "Google"})
    return "Compute Engine is preempting this VM" if answer and answer.strip().upper() == "TRUE" else None


def azure() -> str | None:
    answer = _get(AZURE, {"Metadata": "true"})
    try:
        found = json.loads(answer or "{}")
    except ValueError:
        return None
    events = found.get("Events") if isinstance(found, dict) else None
    listed = events if isinstance(events, list) else []  # (an odd answer: no notice)
    going = [e for e in listed if isinstance(e, dict) and e.get("EventType") in ("Preempt", "Terminate")]
    if not going:
        return None
    return f"Azure scheduled event: {going[0].get('EventType')} at {going[0].get('NotBefore', 'soon')}"


def _file(path: str) -> Callable[[], str | None]:
    def look() -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as notice:
                said = notice.readline().strip()
        except OSError:
            return None
        return said or f"{path} appeared"

    return look


def watcher() -> Callable[[], str | None] | None:
    """What this rank looks at for a notice (``HVD_MAGIC_PREEMPTION``, checked in the notebook
    before launch); None when nothing."""
    where = os.environ.get(ENV_PREEMPTION, "").strip()
    if where.startswith("file:"):
        return _file(where.removeprefix("file:"))
    return {"aws": aws, "gcp": gcp, "azure": azure}.get(where.lower())


def watch(client: HubClient) -> None:
    """Look for a notice on a thread of its own (a metadata service may take its time to not
    answer); tell the notebook of the first one."""
    look = watcher()
    if look is None:
        return
    a_file = os.environ.get(ENV_PREEMPTION, "").strip().startswith("file:")
    every = FILE_LOOK_SECONDS if a_file else LOOK_SECONDS

    def loop() -> None:
        stop = threading.Event()
        while not stop.wait(every):
            try:
                said = look()
            except Exception:  # noqa: BLE001 - one odd answer: look again (the thread is the watch)
                continue
            if said and client.send(Noticed(said)):  # (not sent, the queue full: told at the next look)
                return

    threading.Thread(target=loop, name="hvd_magic-notices", daemon=True).start()
