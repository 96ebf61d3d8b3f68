"""A kernel's run endpoint (issue 78), what the Jupyter server's Horovod panel asks: served from a
thread over a real ZeroMQ ``ipc://`` socket, answered only with its token, and acting on a real
run of real ranks (stacks, stop at once). The panel itself, in JupyterLab: test_lab_panel.py."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import stat
import threading
import time

import numpy as np
import pytest
import zmq

from hvd_magic.errors import RunInterrupted
from hvd_magic.options import make_options
from hvd_magic.protocol import Message, Reports, Started
from hvd_magic.protocol.panel import Endpoint, endpoint_folder, read_endpoints
from hvd_magic.run.endpoint import RunEndpoint
from hvd_magic.run.history import HISTORY, History
from hvd_magic.run.recording import RecordingSink
from hvd_magic.server.kernels import KernelRuns

GATED = """import os, time, hvd_magic
for step in range(1, 1001):
    hvd_magic.report(step=step, total=1000)
    while step == 3 and not os.path.exists({gate!r}):
        time.sleep(0.05)
"""


def ask(folder, request, kernel="k"):
    runs = KernelRuns(folder)
    try:
        endpoint = runs.endpoints({kernel})[kernel]
        return asyncio.run(runs.ask(endpoint, request, seconds=30))
    finally:
        runs.close()


def test_only_the_token_opens_the_record_and_a_row_says_how_the_run_goes(tmp_path):
    folder = endpoint_folder(tmp_path)
    history = History()
    endpoint = RunEndpoint(history, folder, "k")
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(endpoint.file.stat().st_mode) == 0o600
        socket_path = endpoint.endpoint.address.removeprefix("ipc://")
        assert stat.S_IMODE(os.stat(os.path.dirname(socket_path)).st_mode) == 0o700
        entry = history.begin(make_options(np=-2))
        sink = RecordingSink(entry)
        for rank in (0, 1):
            sink.message(Message(Started("host-a", 100 + rank, rank, 2), rank=rank))
            report = [{"step": 10 + rank, "total": 40, "metrics": {"loss": 0.5}}]
            sink.message(Message(Reports(0), rank=rank, blob=json.dumps(report).encode()))

        context = zmq.Context()  # a peer that reached the socket, without the file's token
        bare = context.socket(zmq.REQ)
        bare.connect(endpoint.endpoint.address)
        bare.send_json({"ask": "runs", "token": "guess"})
        assert bare.poll(30_000) and "only with its token" in bare.recv_json()["refused"]
        bare.close(linger=0)
        context.term()

        row = ask(folder, {"ask": "runs"})["runs"][0]
        assert [row[k] for k in ("number", "state", "ranks", "step", "total")] == [1, "running", 2, 10, 40]
        assert row["hosts"] == ["host-a"] and "loss 0.5" in row["summary"]
        shown = ask(folder, {"ask": "run", "number": 1})["run"]
        # the grid and a place for the curves, which come as the live view's plotly traces
        assert (
            "hvd-grid" in shown["html"] and "hvd-curves-here" in shown["html"] and "<svg" not in shown["html"]
        )
        assert [trace["name"] for trace in shown["curves"]["loss"]] == ["rank 0", "rank 1", "mean"]
        assert shown["curves"]["loss"][0]["y"] == [0.5]
        mean_first = ask(folder, {"ask": "run", "number": 1, "per_rank": False})["run"]["curves"]["loss"]
        assert [trace["name"] for trace in mean_first] == ["min of 2 ranks", "max of 2 ranks", "mean"]
        assert "starting its ranks" in ask(folder, {"ask": "stop", "number": 1})["refused"]
        assert "no run 7" in ask(folder, {"ask": "run", "number": 7})["refused"]
        assert "unknown ask" in ask(folder, {"ask": "delete"})["refused"]

        sink.returned(({"w": [1.0] * 500}, {}))
        sink.close(None)
        ended = ask(folder, {"ask": "runs"})["runs"][0]
        assert (ended["state"], ended["outcome"], ended["has_value"]) == ("ended", "finished", True)
        assert ended["value"].startswith("{'w': [1.0, 1.0") and len(ended["value"]) < 100
        assert "hvd-final" in ask(folder, {"ask": "run", "number": 1})["run"]["html"]
        assert "it ended (finished)" in ask(folder, {"ask": "stop", "number": 1})["refused"]
    finally:
        endpoint.close()
    assert read_endpoints(folder) == [] and not os.path.exists(socket_path)


def test_a_dead_kernels_endpoint_file_is_dropped(tmp_path):
    folder = endpoint_folder(tmp_path)
    folder.mkdir(parents=True)
    dead = Endpoint(f"ipc://{tmp_path}/gone/runs.sock", "t", 2**22 + 12345, "gone")  # no such pid
    path = dead.write(folder)
    (folder / "half.json").write_text("{")
    assert read_endpoints(folder) == [] and not path.exists()


def test_a_busy_kernel_stays_listed_and_what_it_reaches_too_late_is_not_done(tmp_path):
    """A kernel whose serving thread is held (here the run's model is locked, as the kernel's own
    thread holds it while it folds a burst of reports; a large timeline's read holds it too):
    the panel lists its runs as it last answered, beside the other kernel's; and a stop the
    server gave up waiting for is refused when the kernel reaches it, not done behind the
    user's back (it was told the kernel did not answer)."""
    folder = endpoint_folder(tmp_path)
    busy, other = History(), History()
    endpoints = [RunEndpoint(busy, folder, "busy"), RunEndpoint(other, folder, "other")]
    runs = KernelRuns(folder)
    try:
        entry = busy.begin(make_options(np=-2))
        RecordingSink(entry), RecordingSink(other.begin(make_options(np=-2)))
        stops: list[bool] = []
        entry.stop = stops.append  # as a supervised run's (RecordingSink.supervising)
        listed = asyncio.run(runs.overview({"busy", "other"}, {}))["runs"]
        assert sorted(run["id"] for run in listed) == ["busy/1", "other/1"]
        assert entry.model is not None
        with entry.model.lock:  # the kernel's thread waits on it from the list's ask on
            listed = asyncio.run(runs.overview({"busy", "other"}, {}, seconds=1.0))["runs"]
            assert sorted(run["id"] for run in listed) == ["busy/1", "other/1"]
            stop = {"ask": "stop", "number": 1, "at_once": False}
            refused = asyncio.run(runs.ask(runs.endpoints({"busy"})["busy"], stop, 1.0))["refused"]
            assert "did not answer within 1 s" in refused
        # the kernel answers in order: once it answers this, it has reached the stop asked above
        assert ask(folder, {"ask": "runs"}, kernel="busy")["runs"][0]["number"] == 1
        assert stops == []
        assert ask(folder, stop, kernel="busy") == {"asked": "stop at the next step boundary"}
        assert stops == [False]
    finally:
        runs.close()
        for endpoint in endpoints:
            endpoint.close()


def panel_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "hvd_magic-panel"}


def test_a_kernel_ending_while_its_endpoint_answers_leaves_the_socket_to_the_answer(tmp_path, monkeypatch):
    """The kernel ends (the endpoint's atexit close) while a request is held up (the run's model
    locked): close returns, the file is gone at once, and the serving thread, once free, answers
    on its socket, still open, and closes it as it ends; nothing raises in it."""
    raised: list[object] = []
    monkeypatch.setattr(threading, "excepthook", raised.append)
    before = panel_threads()
    folder, history = endpoint_folder(tmp_path), History()
    endpoint = RunEndpoint(history, folder, "k")
    (thread,) = panel_threads() - before
    entry = history.begin(make_options(np=-2))
    RecordingSink(entry)
    runs = KernelRuns(folder)
    try:
        assert entry.model is not None
        with entry.model.lock:
            asked = asyncio.run(runs.ask(runs.endpoints({"k"})["k"], {"ask": "runs"}, 1.0))
            assert "did not answer" in asked["refused"]
            endpoint.close()
            assert not endpoint.file.exists() and thread.is_alive()
        thread.join(30)
        assert not thread.is_alive() and raised == []
    finally:
        runs.close()


def test_stacks_and_stop_at_once_reach_a_running_cell(ip, tmp_path):
    """From the endpoint's thread, as the panel asks them: every rank's stacks while the cell
    waits at its gate, then "stop now", which ends the cell at once (RunInterrupted)."""
    folder = endpoint_folder(tmp_path / "runtime")
    endpoint = RunEndpoint(HISTORY, folder, "k")
    gate = tmp_path / "never"
    seen: dict[str, object] = {}

    def panel() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = ask(folder, {"ask": "runs"})["runs"]
            if runs and runs[-1]["state"] == "running" and runs[-1].get("step") == 3:
                number = runs[-1]["number"]
                while time.monotonic() < deadline:  # a rank is asked once its first beat's answer came
                    seen["stacks"] = ask(folder, {"ask": "stacks", "number": number})
                    if "no answer" not in seen["stacks"]["stacks"]:
                        break
                    time.sleep(0.2)
                seen["stop"] = ask(folder, {"ask": "stop", "number": number, "at_once": True})
                return
            time.sleep(0.1)

    thread = threading.Thread(target=panel, daemon=True)
    thread.start()
    try:
        with pytest.raises(RunInterrupted):
            ip.run_cell_magic("horovod", "np=-2 launcher=gloo", GATED.format(gate=str(gate)))
    finally:
        thread.join(timeout=60)
        endpoint.close()
    assert seen["stop"] == {"asked": "stop at once"}
    stacks = seen["stacks"]["stacks"]
    told = re.findall(r"^ranks? ([\d, ]+) on .*: in line [45] of the cell$", stacks, re.MULTILINE)
    assert sorted(int(rank) for ranks in told for rank in ranks.split(", ")) == [0, 1], stacks
    entry = HISTORY.get()
    assert entry is not None and entry.outcome.startswith("RunInterrupted") and not entry.has_value


def test_a_live_session_is_listed_while_it_lives(ip, tmp_path):
    folder = endpoint_folder(tmp_path / "runtime")
    endpoint = RunEndpoint(HISTORY, folder, "k")
    try:
        ip.run_line_magic("horovod", "start np=-2")
        try:
            ip.run_cell_magic("horovod", "", "1 + 1")
            (session,) = ask(folder, {"ask": "runs"})["sessions"]
            assert (session["where"], session["ranks"], session["state"]) == (
                "live session, 2 ranks local",
                2,
                "idle",
            )
            assert session["launcher"] == "Horovod" and session["hosts"]
        finally:
            ip.run_line_magic("horovod", "stop")
        assert ask(folder, {"ask": "runs"})["sessions"] == []
    finally:
        endpoint.close()


def test_a_runs_timeline_is_served_to_the_viewer_as_the_run_writes_it(tmp_path, monkeypatch):
    """What the tab's timeline viewer (the notebook's own JavaScript) is sent, through the real
    socket: nothing before the run writes, an overview of what is written so far (and the detail
    of a window asked for), the rest once it ended, nothing again for a version the tab has."""
    from hvd_magic.run import served_timeline
    from hvd_magic.timeline import viewer_data

    from .test_timeline_store import spans_timeline

    monkeypatch.setattr(viewer_data, "DIRECT_SPANS", 1_000)  # an overview and windows, as for a large one
    monkeypatch.setattr(served_timeline, "REFRESH_SECONDS", 0)  # read at every ask, not every 3 s
    folder, history, path = endpoint_folder(tmp_path), History(), tmp_path / "timeline.json"
    whole = spans_timeline(tmp_path / "whole.json", random.Random(5), rows=3, per_row=600).read_bytes()
    path.write_bytes(whole)
    os.utime(path, (time.time() - 60, time.time() - 60))  # an earlier run's file: not this run's
    endpoint = RunEndpoint(history, folder, "k")
    try:
        history.begin(make_options(np=-2))
        assert "writes no timeline" in ask(folder, {"ask": "timeline", "number": 1})["refused"]
        entry = history.begin(make_options(np=-2, timeline=str(path)))
        assert ask(folder, {"ask": "run", "number": 2})["run"]["timeline"] is True
        before = ask(folder, {"ask": "timeline", "number": 2})
        assert "no timeline yet" in before["said"] and "traits" not in before

        path.write_bytes(whole[: whole.index(b"}, {", len(whole) // 2) + 3])  # half, as rank 0 streams it
        half = ask(folder, {"ask": "timeline", "number": 2})
        traits = half["traits"]
        assert traits["lod"] and "so far" in half["said"] and set(half["binary"]) >= {"starts", "counts"}
        spans_so_far = int(np.frombuffer(base64.b64decode(traits["counts"]), np.uint32).sum())
        assert traits["row_names"] == ["t1", "t2"] and spans_so_far == int(
            half["said"].split()[1].replace(",", "")
        )
        window = {"type": "window", "id": 7, "t0": 0, "t1": traits["end_us"] / 4, "width": 300, "rows": [0]}
        detail = ask(folder, {"ask": "timeline", "number": 2, "window": window})
        assert detail["reply"]["id"] == 7 and detail["reply"]["rows"] == [0] and len(detail["buffers"]) == 6
        endless = ask(folder, {"ask": "timeline", "number": 2, "window": window | {"width": float("inf")}})
        assert endless["reply"]["rows"] == []  # a malformed window: an empty reply; the endpoint serves on

        path.write_bytes(whole)
        entry.ended = time.time()
        done = ask(folder, {"ask": "timeline", "number": 2, "version": half["version"]})
        assert done["version"] > half["version"] and done["traits"]["row_names"] == ["t1", "t2", "t3"]
        assert "so far" not in done["said"]
        assert "traits" not in ask(folder, {"ask": "timeline", "number": 2, "version": done["version"]})
    finally:
        endpoint.close()


def test_a_metric_gone_to_nan_is_a_gap_in_the_tabs_curves_not_a_broken_answer(tmp_path):
    """A diverging run's loss (NaN, inf) goes to the tab as null, a gap where plotly draws NaN;
    the answer is JSON a browser parses."""
    folder, history = endpoint_folder(tmp_path), History()
    endpoint = RunEndpoint(history, folder, "k")
    try:
        sink = RecordingSink(history.begin(make_options(np=-1)))
        sink.message(Message(Started("host-a", 100, 0, 1), rank=0))
        reports = [{"step": step, "metrics": {"loss": loss}} for step, loss in ((1, 0.5), (2, float("nan")))]
        sink.message(Message(Reports(0), rank=0, blob=json.dumps(reports).encode()))
        curves = ask(folder, {"ask": "run", "number": 1})["run"]["curves"]["loss"]
        assert [trace["y"] for trace in curves if trace["name"] == "rank 0"] == [[0.5, None]]
    finally:
        endpoint.close()
