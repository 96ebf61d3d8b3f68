"""The kernel's run endpoint: its record of runs (``run.history``), served to the Jupyter
server's Horovod panel from a thread, so that a run outlives the browser tab that started it.

Only inside a Jupyter kernel (the server knows its kernels by id; a terminal IPython has
``%horovod runs``). The socket is a ZeroMQ ``ipc://`` one in a folder of its own that only this
user may enter (a temporary one, mode 0700: a Unix socket's path must stay short) and every
request must carry the token of the endpoint file (mode 0600, in ``<runtime>/hvd-magic/``);
``protocol.panel`` says what is asked. What the panel shows is read here under
each model's lock (the kernel's thread folds messages into it meanwhile); the stop and the
stacks go through the entry to the run's own ``GracefulStop`` and ``stacks.where_now``.
``HVD_MAGIC_PANEL=0`` turns the endpoint off.
"""

from __future__ import annotations

import atexit
import hmac
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from hvd_magic.protocol.panel import ASKS, Endpoint, endpoint_folder, refusal
from hvd_magic.run.history import History, RunEntry
from hvd_magic.widgets.render import final_html, plotted
from hvd_magic.widgets.state import RunModel

if TYPE_CHECKING:
    from hvd_magic.run.served_timeline import ServedTimeline

__all__ = ["RunEndpoint", "row", "serve_in_kernel", "serving", "tab_view"]

POLL_MS = 200  # how often the serving thread looks at its stop flag
_serving: list[RunEndpoint | None] = []  # the kernel's endpoint once a run began (None: it failed)


class RunEndpoint:
    """Serves ``history`` at an ``ipc://`` socket in ``folder`` to whoever holds the token."""

    def __init__(self, history: History, folder: Path, kernel: str) -> None:
        self.history = history
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.REP)
        self._socket.setsockopt(zmq.LINGER, 0)
        socket_path = Path(tempfile.mkdtemp(prefix="hvd-magic-")) / "runs.sock"  # mode 0700
        self._socket.bind(f"ipc://{socket_path}")
        os.chmod(socket_path, 0o600)
        self.endpoint = Endpoint(f"ipc://{socket_path}", secrets.token_hex(24), os.getpid(), kernel)
        self.file = self.endpoint.write(folder)
        self._stop = threading.Event()
        self._timelines: dict[int, ServedTimeline] = {}  # by run number: read as its file grows
        self.cpu = 0.0  # CPU seconds the serving thread has used (what being served costs the kernel)
        self._thread = threading.Thread(target=self._serve, name="hvd_magic-panel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self._serve_until_stopped()
        finally:  # the socket is this thread's: closed here, never under a request it answers
            self._socket.close(linger=0)

    def _serve_until_stopped(self) -> None:
        began = time.thread_time()
        while not self._stop.is_set():
            self.cpu = time.thread_time() - began
            if not self._socket.poll(POLL_MS):
                continue
            try:
                request = json.loads(self._socket.recv())
            except ValueError:
                request = None
            try:
                reply = self.answer(request) if isinstance(request, dict) else refusal("not a JSON request")
                answer = json.dumps(reply, default=str, allow_nan=False)
            except Exception as err:  # noqa: BLE001 - one ask's failure: said, and the socket stays in step
                answer = json.dumps(refusal(f"the kernel could not answer: {type(err).__name__}: {err}"))
            self._socket.send(answer.encode())

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply to one request (``protocol.panel``); refused without this kernel's token."""
        token = request.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token, self.endpoint.token):
            return refusal("this kernel's run endpoint answers only with its token")
        until = request.get("until")
        if isinstance(until, int | float) and time.time() > until:  # the asker has given up on it
            return refusal(f"asked {time.time() - until:.0f} s before this kernel could answer: not done")
        ask = request.get("ask")
        if ask == "runs":
            runs = [row(entry) for entry in list(self.history.entries)]
            sessions = [session() for session in list(self.history.sessions.values())]
            return {"kernel": self.endpoint.kernel, "runs": runs, "sessions": sessions}
        if ask not in ASKS:
            return refusal(f"unknown ask {ask!r}: one of {', '.join(ASKS)}")
        entry = self.history.get(request.get("number")) if isinstance(request.get("number"), int) else None
        if entry is None:
            return refusal(f"no run {request.get('number')!r} is kept in this kernel")
        if ask == "run":
            html, curves = _view(entry, bool(request.get("per_rank", True)))
            return {"run": row(entry) | {"html": html, "curves": curves, "timeline": bool(entry.timeline)}}
        if ask == "timeline":
            return self._timeline(entry, request)
        stop, stacks = entry.stop, entry.stacks
        if ask == "stop" and stop is not None:
            stop(bool(request.get("at_once")))
            return {"asked": "stop at once" if request.get("at_once") else "stop at the next step boundary"}
        if ask == "stacks" and stacks is not None:
            return {"stacks": stacks()}
        if entry.ended is None:
            return refusal(f"run {entry.number} is starting its ranks: ask again in a moment")
        return refusal(f"run {entry.number} is not running: it ended ({entry.outcome})")

    def _timeline(self, entry: RunEntry, request: dict[str, Any]) -> dict[str, Any]:
        if not entry.timeline:
            return refusal(f"run {entry.number} writes no timeline (give timeline= to the cell)")
        from hvd_magic.run.served_timeline import ServedTimeline  # the reader: only once a tab asks

        kept = {e.number for e in list(self.history.entries)}  # a copy: the kernel's thread appends
        self._timelines = {n: served for n, served in self._timelines.items() if n in kept}
        if entry.number not in self._timelines:
            self._timelines[entry.number] = ServedTimeline(entry.timeline, entry.started)
        return self._timelines[entry.number].answer(request, ended=entry.ended is not None)

    def close(self) -> None:
        """Stop serving: the endpoint file and socket go at once; the thread, answering a
        request still, closes its socket when it is done (the context goes with the process)."""
        self._stop.set()
        self._thread.join(timeout=2)
        if not self._thread.is_alive():
            self._context.term()
        self.file.unlink(missing_ok=True)
        self.endpoint.remove_socket()


def _view(entry: RunEntry, every_rank: bool) -> tuple[str, dict[str, Any]]:
    """What a run's tab shows of it: the kernel's HTML of its view (summary, grid, logs), and its
    curves' plotly traces, as under the cell; every rank's row and line, or not."""
    model = entry.model
    if model is None:
        return entry.views.get(every_rank, (entry.final, {}))
    with model.lock:
        return tab_view(model, every_rank)


def tab_view(model: RunModel, every_rank: bool) -> tuple[str, dict[str, Any]]:
    return final_html(model, every_rank, curves=False), plotted(model, every_rank)


def row(entry: RunEntry) -> dict[str, Any]:
    """What the panel lists of a run: its record, and while it runs, how it goes."""
    shown: dict[str, Any] = {
        "number": entry.number,
        "where": entry.where,
        "ranks": entry.ranks,
        "launcher": entry.launcher,  # "local · Horovod (Gloo)", "Spark Connect sc://host:15002 · ..."
        "state": "running" if entry.ended is None else "ended",
        "outcome": entry.outcome,
        "began": entry.started,
        "seconds": round(entry.seconds, 1),
        "summary": entry.summary,
        "has_value": entry.has_value,
        "value": entry.value_text,
        "cell": entry.cell,
    }
    model = entry.model
    if model is not None:
        with model.lock:
            shown |= _going(model, time.monotonic())
    return shown


def _going(model: RunModel, now: float) -> dict[str, Any]:
    ranks = model.progress
    steps = [p.step for p in ranks if p.step is not None]
    rates = [rate for p in ranks if (rate := p.rate_at(now)) is not None]
    etas = [eta for p in ranks if (eta := p.eta_at(now)) is not None]
    seen = [p.resources for p in ranks if p.resources is not None]
    straggler = next((p.straggling.text() for p in ranks if p.straggling is not None), "")
    attempt = next((text for text in reversed(model.notices) if "attempt" in text), "")
    return {
        "summary": model.summary(),
        "counts": {state: n for state, n in model.counts().items() if n},
        "hosts": sorted({p.host for p in ranks if p.host}),
        "step": min(steps) if steps else None,
        "total": max((p.total for p in ranks if p.total), default=None),
        "epoch": max((p.epoch for p in ranks if p.epoch is not None), default=None),
        "steps_per_s": round(statistics.median(rates), 3) if rates else None,
        "eta": round(max(etas), 1) if etas else None,
        "cpu": round(statistics.fmean(s.cpu for s in seen), 1) if seen else None,
        "memory": max((s.rss for s in seen), default=None),
        "gpu": max((s.gpu_text() for s in seen if s.gpu >= 0), default=""),
        "slow": straggler,
        "attempt": attempt,
    }


def jupyter_kernel() -> tuple[str, Path] | None:
    """This Jupyter kernel's id (from its connection file's name) and the folder of that file
    (the runtime folder of the server that started it, where the server looks for endpoint
    files: ``--ServerApp.runtime_dir`` may name another than the kernel's own default); None
    outside a Jupyter kernel."""
    kernelapp = sys.modules.get("ipykernel.kernelapp")
    if kernelapp is None or not kernelapp.IPKernelApp.initialized():
        return None
    connection = Path(kernelapp.IPKernelApp.instance().abs_connection_file)
    return connection.stem.removeprefix("kernel-"), connection.parent


def serving() -> bool:
    """Whether this kernel serves its record to the Horovod panel."""
    return bool(_serving) and _serving[0] is not None


def serve_in_kernel(history: History) -> None:
    """Start the kernel's endpoint at its first run, once; nothing outside a Jupyter kernel."""
    if _serving or os.environ.get("HVD_MAGIC_PANEL") == "0":
        return
    kernel = jupyter_kernel()
    if kernel is None:
        return
    try:
        endpoint = RunEndpoint(history, endpoint_folder(kernel[1]), kernel[0])
    except (OSError, zmq.ZMQError) as err:
        print(f"hvd_magic: the Horovod panel cannot show this kernel's runs: {err}", file=sys.stderr)
        _serving.append(None)  # said once, not tried again
        return
    _serving.append(endpoint)
    atexit.register(endpoint.close)
