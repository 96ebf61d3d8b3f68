"""Timelines written by real Horovod runs, shared by the timeline tests.

Import the fixture into a test module (``from .timeline_fixtures import real_timelines``); the
runs happen once per test session, whichever modules ask for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

TRAIN = """
import horovod.torch as hvd, torch
hvd.init()
model = torch.nn.Linear(10, 10)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
hvd.rank()
"""

_recorded: dict[str, Path] = {}


@pytest.fixture(scope="session")
def real_timelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Timelines written by real Horovod runs through %%horovod timeline=PATH, by launcher."""
    if not _recorded:
        shell = InteractiveShell.instance()
        shell.run_cell("%load_ext hvd_magic")
        folder = tmp_path_factory.mktemp("timelines")
        for launcher in ("mpi", "gloo"):
            path = folder / f"{launcher}.json"
            assert shell.run_cell_magic("horovod", f"np=-2 launcher={launcher} timeline={path}", TRAIN) == 0
            _recorded[launcher] = path
    return dict(_recorded)


def write_events(path: Path, events: list[dict[str, Any]]) -> Path:
    """A timeline file of these events, as ``json.dumps`` lays them out."""
    path.write_text(json.dumps(events))
    return path


def reference_spans(events: list[dict[str, Any]]) -> list[tuple[int, str, int, int, int]]:
    """(pid, name, start, end, depth) of each span, by a plain stack per tensor: the slow,
    obvious pairing that ``Timeline.spans()`` does without a Python loop."""
    open_spans: dict[int, list[dict[str, Any]]] = {}
    found = []
    for event in events:
        stack = open_spans.setdefault(event.get("pid", -1), [])
        if event["ph"] == "B":
            stack.append(event)
        elif event["ph"] == "E" and stack:
            begin = stack.pop()
            found.append((begin["pid"], begin["name"], begin["ts"], event["ts"], len(stack)))
    return sorted(found)
