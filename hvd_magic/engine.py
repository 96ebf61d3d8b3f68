"""One run, whatever started it (``%%horovod`` or ``HorovodRunner``): hub + launcher + supervision.

``execute`` starts the hub with the payload, starts the launcher, feeds rank events to a view
(console lines, widgets) and turns the outcome into rank 0's value or one clear exception.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import cloudpickle

from .capture import Captured
from .errors import RankFailedError, RunError, RunInterrupted, RunTimeout
from .hub import Event, Hub
from .launch import Launcher, LaunchPlan, RankDeath, thread_budget_env
from .launch.local import LocalGlooLauncher, LocalMpiLauncher
from .options import RunOptions
from .worker import ENV_HUB, ENV_TOKEN

__all__ = ["ConsoleView", "RunView", "execute", "make_view"]

# After the launcher exits, how long to wait for ranks' last messages still in flight.
DRAIN_SECONDS = 5.0
PUMP_BATCH = 2000
START_TIMEOUT = float(os.environ.get("HVD_MAGIC_START_TIMEOUT", "300"))
CAUSE_GRACE = 3.0  # seconds to look for the cause behind a "Horovod has been shut down" error


class RunView(Protocol):
    """Where a run's events go: console lines here, widgets in the notebook."""

    def notice(self, text: str) -> None: ...

    def event(self, event: Event) -> None: ...

    def tick(self) -> None:
        """Called after each batch of events: a view may redraw here (throttled)."""

    def close(self) -> None: ...


class ConsoleView:
    """Prints rank output as it arrives, each line tagged with its rank: ``[1] text``."""

    def __init__(self) -> None:
        self._at_line_start: dict[tuple[int, str], bool] = {}

    def notice(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def event(self, event: Event) -> None:
        if event.kind != "log":
            return
        stream = str(event.header.get("stream", "stdout"))
        text = event.blob.decode("utf-8", errors="replace")
        out = sys.stderr if stream == "stderr" else sys.stdout
        key = (event.rank, stream)
        pieces = []
        for line in text.splitlines(keepends=True):
            if self._at_line_start.get(key, True):
                pieces.append(f"[{event.rank}] ")
            pieces.append(line)
            self._at_line_start[key] = line.endswith("\n")
        out.write("".join(pieces))
        out.flush()

    def tick(self) -> None:
        pass

    def close(self) -> None:
        for (_rank, stream), at_start in self._at_line_start.items():
            if not at_start:
                (sys.stderr if stream == "stderr" else sys.stdout).write("\n")


@dataclass
class _RunState:
    ranks: int
    started: dict[int, str] = field(default_factory=dict)  # rank -> host
    exited: dict[int, int] = field(default_factory=dict)
    errors: list[Event] = field(default_factory=list)  # in arrival order
    result: bytes | None = None
    began: float = field(default_factory=time.monotonic)
    last_event: float = field(default_factory=time.monotonic)
    last_seen: dict[int, float] = field(default_factory=dict)
    timeline_path: str | None = None
    timeline_bytes: int = 0

    def apply(self, event: Event) -> None:
        self.last_event = event.received
        self.last_seen[event.rank] = event.received
        if event.kind == "file" and self.timeline_path and event.rank == 0:
            with open(self.timeline_path, "wb" if self.timeline_bytes == 0 else "ab") as out:
                out.write(event.blob)
            self.timeline_bytes += len(event.blob)
        if event.kind == "started":
            self.started[event.rank] = str(event.header.get("host", ""))
        elif event.kind == "error":
            self.errors.append(event)
        elif event.kind == "result":
            self.result = event.blob
        elif event.kind == "exit":
            self.exited[event.rank] = int(event.header.get("code", 0))

    def missing(self, ranks: dict[int, Any] | dict[int, str]) -> list[int]:
        return [r for r in range(self.ranks) if r not in ranks]

    @property
    def cause(self) -> Event | None:
        """The error to blame: the first that is not a consequence of another rank's failure."""
        return next((e for e in self.errors if not _is_consequence(e)), None)

    @property
    def first_error(self) -> Event | None:
        return self.cause or (self.errors[0] if self.errors else None)


def _is_consequence(error: Event) -> bool:
    """Horovod shuts down on every rank once one fails; the others then raise this. A
    KeyboardInterrupt in a rank is our own stop (ranks have sessions of their own)."""
    header = error.header
    return header.get("exc_type") in ("HorovodInternalError", "KeyboardInterrupt") or (
        "Horovod has been shut down" in str(header.get("message", ""))
    )


def _rank_env(options: RunOptions, hub: Hub, local: bool) -> dict[str, str]:
    env = dict(options.env)
    if local:  # on Spark, each task sets the budget of its own host
        env |= thread_budget_env(options.ranks, os.cpu_count() or 1, options.env)
    if "TF_USE_LEGACY_KERAS" not in env and "TF_USE_LEGACY_KERAS" not in os.environ:
        # Horovod's Keras binding needs Keras 2 (tf-keras) on TensorFlow >= 2.16.
        env["TF_USE_LEGACY_KERAS"] = "1"
    if options.timeline:
        # Written on rank 0's host (maybe an executor), streamed back by the worker at the end.
        env["HOROVOD_TIMELINE"] = os.path.join(
            tempfile.gettempdir(), f"hvd_magic-timeline-{uuid.uuid4().hex}.json"
        )
        if options.mark_cycles:
            env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    env[ENV_HUB] = hub.address
    env[ENV_TOKEN] = hub.keys.client_token()
    return env


def _prepare(blob: bytes, options: RunOptions) -> tuple[Hub, Launcher]:
    command = [sys.executable, "-m", "hvd_magic.worker"]
    if options.np < 0:
        hub = Hub("127.0.0.1", blob)
        plan = LaunchPlan(options.ranks, command, _rank_env(options, hub, True), launcher=options.launcher)
        if options.launcher == "gloo":
            return hub, LocalGlooLauncher(plan)
        return hub, LocalMpiLauncher(plan)
    from .launch.spark import SparkLauncher, active_or_embedded_session, driver_address

    session = active_or_embedded_session()
    hub = Hub(driver_address(session), blob)
    plan = LaunchPlan(options.ranks, command, _rank_env(options, hub, False), launcher=options.launcher)
    task_cpus = int(session.sparkContext.getConf().get("spark.task.cpus", "1"))
    return hub, SparkLauncher(plan, hub, session, task_cpus)


def make_view(ranks: int) -> RunView:
    """Live widgets in a Jupyter kernel (when ipywidgets and plotly are installed), else text."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
            from .widgets.view import LiveView

            return LiveView(ranks)
    except ImportError:
        pass
    return ConsoleView()


def execute(captured: Captured, options: RunOptions, view: RunView | None = None) -> Any:
    """Run the payload on ``options.np`` ranks; return rank 0's value (and returned names)."""
    view = view or make_view(options.ranks)
    for text in captured.notices:
        view.notice(text)
    if options.timeline:
        view.notice(
            f"timeline on, written to {options.timeline}: recording it slows training "
            "(HorovodRunner's docs measured ~40 % for Inception3)"
        )
    try:
        hub, launcher = _prepare(captured.blob, options)
    except KeyboardInterrupt:
        raise RunInterrupted("interrupted before any rank started; nothing was launched.") from None
    state = _RunState(options.ranks, timeline_path=options.timeline)
    try:
        launcher.start()
        return _supervise(hub, launcher, state, view, options)
    except KeyboardInterrupt:
        pass
    finally:
        with _interrupts_deferred():  # pressing stop again must not cut the clean-up short
            launcher.stop()
            view.close()
            hub.close()
    raise RunInterrupted(
        f"interrupted: the {options.ranks} ranks were stopped. The notebook's state is unchanged."
    )


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT (the notebook's interrupt) back while the block runs; the stop is bounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _supervise(hub: Hub, launcher: Launcher, state: _RunState, view: RunView, options: RunOptions) -> Any:
    while True:
        _pump(hub, state, view, wait=0.1)
        view.tick()
        if state.errors:
            failure = _rank_failed(state, _find_cause(hub, state, view, launcher))  # before the stop
            launcher.stop()
            _pump(hub, state, view, wait=0)
            raise failure
        code = launcher.poll()
        if code is not None:
            _drain(hub, state, view)
            return _outcome(state, code, launcher)
        _check_time_limits(state, options, launcher)


def _check_time_limits(state: _RunState, options: RunOptions, launcher: Launcher) -> None:
    now = time.monotonic()
    never = state.missing(state.started)
    if never and now - state.began > START_TIMEOUT:
        launcher.stop()
        raise RunTimeout(
            f"ranks {never} did not start within {START_TIMEOUT:.0f} s ({len(state.started)} of "
            f"{state.ranks} did); the run was stopped. Check the launcher output above, or set "
            "HVD_MAGIC_START_TIMEOUT for slow clusters."
        )
    if options.timeout and now - state.last_event > options.timeout:
        launcher.stop()
        silent = ", ".join(
            f"rank {r} for {now - t:.0f} s" for r, t in sorted(state.last_seen.items()) if r >= 0
        )
        raise RunTimeout(
            f"no rank reported anything for {options.timeout:.0f} s (timeout={options.timeout:g}); "
            f"the run was stopped. Silent: {silent or 'every rank'}."
            + (f" Never started: ranks {never}." if never else "")
        )


def _pump(hub: Hub, state: _RunState, view: RunView, wait: float) -> None:
    """Apply the waiting events, up to a batch, so the view gets its ticks under any load."""
    try:
        event = hub.events.get(timeout=wait) if wait else hub.events.get_nowait()
    except queue.Empty:
        return
    for _ in range(PUMP_BATCH):
        state.apply(event)
        view.event(event)
        try:
            event = hub.events.get_nowait()
        except queue.Empty:
            return
    state.apply(event)
    view.event(event)


def _drain(hub: Hub, state: _RunState, view: RunView) -> None:
    deadline = time.monotonic() + DRAIN_SECONDS
    while len(state.exited) < len(state.started) and time.monotonic() < deadline:
        _pump(hub, state, view, wait=0.05)
    _pump(hub, state, view, wait=0)


def _find_cause(hub: Hub, state: _RunState, view: RunView, launcher: Launcher) -> RankDeath | None:
    """A rank's error that only says Horovod shut down has its cause elsewhere: another rank's
    error still on its way, or a rank that died without a word (killed, OOM). Wait briefly for
    either, before anything is stopped and the evidence with it."""
    deadline = time.monotonic() + CAUSE_GRACE
    while state.cause is None:
        death = _silent_death(state, launcher)
        if death is not None or time.monotonic() > deadline:
            return death
        _pump(hub, state, view, wait=0.05)
    return None


def _silent_death(state: _RunState, launcher: Launcher) -> RankDeath | None:
    """The first rank the launcher saw end that had not reported an error or its exit."""
    spoke = {error.rank for error in state.errors} | set(state.exited)
    return next((death for death in launcher.deaths() if death.rank not in spoke), None)


def _rank_failed(state: _RunState, death: RankDeath | None) -> RankFailedError:
    error = state.first_error
    assert error is not None
    header = error.header
    if state.cause is None and death is not None:
        return RankFailedError(
            rank=death.rank,
            host=death.host or state.started.get(death.rank, ""),
            exc_type="",
            message=f"it {death.what}; then rank {error.rank} failed with {header.get('exc_type')}",
            remote_traceback="",
            stopped=state.ranks - 1,
        )
    return RankFailedError(
        rank=error.rank,
        host=str(header.get("host", "")),
        exc_type=str(header.get("exc_type", "Exception")),
        message=str(header.get("message", "")),
        remote_traceback=str(header.get("traceback", "")),
        stopped=state.ranks - 1,
    )


def _outcome(state: _RunState, code: int, launcher: Launcher) -> Any:
    if state.errors:
        raise _rank_failed(state, _silent_death(state, launcher))
    never_started = state.missing(state.started)
    unfinished = [r for r in state.started if r not in state.exited]
    if code != 0 or never_started or unfinished or state.result is None:
        problems = []
        if never_started:
            problems.append(f"ranks {never_started} never started")
        death = _silent_death(state, launcher)
        if death is not None:
            problems.append(f"rank {death.rank} {death.what}")
            unfinished = [r for r in unfinished if r != death.rank]
        if unfinished:
            problems.append(
                f"ranks {sorted(unfinished)} died without reporting (killed, or crashed in native code)"
            )
        if state.result is None and not problems:
            problems.append("rank 0 finished without sending its result")
        tail = launcher.diagnostics()
        raise RunError(
            f"the run failed (launcher exit code {code}): "
            + "; ".join(problems or ["see the output above"])
            + (f"\n\nlauncher output:\n{tail}" if tail else "")
        )
    try:
        return cloudpickle.loads(state.result)
    except Exception as err:  # noqa: BLE001 - whatever the value's class does when unpickled
        raise RunError(
            f"the run finished, but rank 0's value (the cell's last expression, or return= names) "
            f"could not be loaded in the notebook: {type(err).__name__}: {str(err)[:300]}. End the "
            "cell with ';' or return plain data (numbers, lists, arrays, state_dicts)."
        ) from None
