"""A Spark task's hold on its slot (``launch/task/slot.py``), with a real hub and a real process."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest

from hvd_magic.hub import Hub
from hvd_magic.launch.task.slot import hold_slot
from hvd_magic.protocol import Release
from hvd_magic.rank.hub_client import HubClient

TALKER = "while True: print('still talking', flush=True)"


def test_a_task_released_while_its_process_still_talks_ends_its_reader_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The task returns and closes its client while output still comes. Spark keeps the task's
    Python worker for the next task, so the thread that forwarded the output must end there
    without a traceback."""
    raised: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", raised.append)
    hub = Hub("127.0.0.1", payload=b"")
    process = subprocess.Popen([sys.executable, "-c", TALKER], stdout=subprocess.PIPE)
    client = HubClient(hub.address, hub.keys.client_token(), rank=-1)

    def release_once_it_talks() -> None:
        first = hub.control.get(timeout=60)  # the process's first line, forwarded (a launcher's word)
        hub.send_to(first.identity, Release())

    releaser = threading.Thread(target=release_once_it_talks, daemon=True)
    before = {*threading.enumerate(), releaser}
    releaser.start()
    try:
        assert hold_slot(client, process) == 0  # released: the process was not the task's to end
        client.close()  # as the task does next
        for reader in [thread for thread in threading.enumerate() if thread not in before]:
            reader.join(timeout=30)
            assert not reader.is_alive(), "the reader went on after its client was closed"
        assert raised == [], [str(args.exc_value) for args in raised]
    finally:
        process.kill()
        process.wait()
        hub.close()
