"""Live sessions on this machine: ranks started once (real mpirun, Gloo or torch.distributed,
real Horovod), cells run on them in kept namespaces; errors, interrupts, status and stop."""

from __future__ import annotations

import functools
import os
import re
import signal
import threading
import time
from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError

from hvd_magic import RankFailedError, RunError, RunInterrupted, Session, SessionEnded
from hvd_magic.options import make_options
from hvd_magic.protocol import Cell
from hvd_magic.run.packing import pack_cell
from hvd_magic.session import commands as sessions
from hvd_magic.session import live, ranks
from hvd_magic.session.cell import CellLauncher

from .fakes import ScriptedLauncher, nothing
from .helpers import RecordingView, leftover_processes, wait_for_ranks, when_started
from .test_retry import recorded_stops, wait_until

START = {"mpi": "launcher=mpi", "gloo": "launcher=gloo", "torch": "backend=torch"}
RANK = {"mpi": "hvd.rank()", "gloo": "hvd.rank()", "torch": "dist.get_rank()"}
SUM = {
    "mpi": "hvd.allreduce(w, op=hvd.Sum).item()",
    "gloo": "hvd.allreduce(w, op=hvd.Sum).item()",
    "torch": "dist.all_reduce(w) or w.item()",
}


@pytest.fixture
def session(ip):
    """The shell, with whatever session a test starts stopped afterwards."""
    yield ip
    sessions.stop()


@pytest.mark.parametrize("kind", ["mpi", "gloo", "torch"])
def test_state_and_output_stay_with_their_cells_across_three_cells(session, kind, capsys):
    session.run_line_magic("horovod", f"start np=-2 {START[kind]}")
    assert "live session: 2 ranks on this machine" in capsys.readouterr().err
    pids = {rank: info.started.pid for rank, info in sessions.current().ranks.items()}
    built = f"import torch\nw = torch.tensor([{RANK[kind]} + 1.0])\nprint('built on', {RANK[kind]})\n"
    session.run_cell_magic("horovod", "", built)
    first = capsys.readouterr()
    session.run_cell_magic("horovod", "", "w *= 10\nprint('scaled')")
    second = capsys.readouterr()
    assert session.run_cell_magic("horovod", "", SUM[kind]) == 30.0  # (1 + 2) * 10: both cells' work
    assert "built on 0" in first.out and "built on 1" in first.out and "scaled" not in first.out
    assert "scaled" in second.out and "built on" not in second.out
    same = {rank: info.started.pid for rank, info in sessions.current().ranks.items()}
    assert same == pids, first.err + second.err  # the same ranks; if not, what the cells said
    session.run_line_magic("horovod", "status")
    status = capsys.readouterr().out
    assert "live session: 2 ranks" in status and all(str(pid) in status for pid in pids.values())
    assert status.count("idle") == 2 and "MB" in status
    session.run_line_magic("horovod", "stop")
    assert "its 2 ranks ended" in capsys.readouterr().out
    assert leftover_processes() == []


def test_a_cell_on_some_ranks_the_notebooks_names_and_a_failed_cell_in_step(session):
    """(One session for both: a failed cell with the ranks in step leaves it usable.)"""
    session.run_line_magic("horovod", "start np=-2")
    session.run_cell("scale = 3.0")  # a notebook name, read by the next cell: it travels
    session.run_cell_magic("horovod", "", "import torch\nw = torch.tensor([hvd.rank() + 1.0]) * scale")
    assert session.run_cell_magic("horovod", "rank=1", "w.item()") == 6.0  # rank 1's own value
    assert session.run_cell_magic("horovod", "ranks=0,1", "w.item()") == 3.0  # the lowest rank's
    session.run_cell("w = 'the notebook has a w too'")
    assert session.run_cell_magic("horovod", "", "w.item()") == 3.0  # the ranks' w is theirs
    with pytest.raises(UsageError, match="ranks 0 to 1"):
        session.run_cell_magic("horovod", "rank=2", "1")
    with pytest.raises(UsageError, match="env= is set when the session starts"):
        session.run_cell_magic("horovod", "env=A=1", "1")
    with pytest.raises(UsageError, match="retries= restarts a run's ranks from its latest checkpoint"):
        session.run_cell_magic("horovod", "retries=2", "1")  # would be dropped silently: refused
    with pytest.raises(UsageError, match="stragglers takes"):
        session.run_cell_magic("horovod", "stragglers=fast", "1")  # the cell's own rule, checked
    assert session.run_cell_magic("horovod", "stragglers=0.5/20", "w.item()") == 3.0
    with pytest.raises(RankFailedError, match="rank 1") as info:
        session.run_cell_magic("horovod", "", "if hvd.rank() == 1:\n    raise ValueError('bad row')\n1")
    assert "ValueError: bad row" in str(info.value)
    assert session.run_cell_magic("horovod", "", "hvd.allreduce(w, op=hvd.Sum).item()") == 9.0  # (1 + 2) * 3


def test_a_rank_left_in_a_collective_ends_the_session_and_the_next_cell_starts_anew(session, capsys):
    session.run_line_magic("horovod", "start np=-2")
    session.run_cell_magic("horovod", "", "import torch\nw = torch.tensor([1.0])")
    old = sorted(info.started.pid for info in sessions.current().ranks.values())
    started = time.monotonic()
    # rank 0 waits in a collective rank 1 never joins, and does not leave it when interrupted: it
    # ignores the interrupt from before rank 1 fails (the two meet in "ready" once it does), as an
    # interrupt that came before a `try` would have ended its cell (a race this test once lost)
    cell = (
        "import signal\n"
        "if hvd.rank() == 0:\n    signal.signal(signal.SIGINT, lambda *_: None)\n"
        "hvd.allreduce(w, name='ready')\n"
        "if hvd.rank() == 1:\n    raise ValueError('bad row')\n"
        "hvd.allreduce(w, name='never').item()\n"
    )
    with pytest.raises(RankFailedError, match="rank 1") as info:
        session.run_cell_magic("horovod", "", cell)
    assert time.monotonic() - started < 60
    assert any("the live session ended" in note for note in info.value.__notes__)
    capsys.readouterr()
    assert session.run_cell_magic("horovod", "", "'w' in globals()") is False  # a new session
    assert "starting a new one" in capsys.readouterr().err
    assert sorted(info.started.pid for info in sessions.current().ranks.values()) != old


@pytest.mark.timeout(180)  # the old code waited for rank 1 for ever: rank 0 answers every beat
@pytest.mark.parametrize("kind", ["gloo", "torch"])
def test_a_rank_whose_own_process_ends_in_a_cell_fails_it_naming_the_rank(session, kind, capsys):
    """A process a rank (Gloo, torch.distributed): rank 1's ends in a cell (os._exit here, an OOM
    kill alike) while rank 0 finishes it. The cell fails naming rank 1 and how it ended, and the
    next cell runs on a new session (mpirun ends its whole job: its sessions never waited)."""
    session.run_line_magic("horovod", f"start np=-2 {START[kind]}")
    session.run_cell_magic("horovod", "", "kept = 1")
    cell = f"import os\nif {RANK[kind]} == 1:\n    os._exit(3)\n'rank 0 finished'\n"
    with pytest.raises(RunError, match="rank 1 exited with code 3 without reporting") as info:
        session.run_cell_magic("horovod", "", cell)
    assert any("the live session ended: rank 1 exited with code 3" in note for note in info.value.__notes__)
    capsys.readouterr()
    assert session.run_cell_magic("horovod", "", "'kept' in globals()") is False  # a new session
    assert "starting a new one" in capsys.readouterr().err


def test_a_graceful_stop_is_its_cells_own_and_the_next_cell_is_stopped_gracefully_too(
    session, tmp_path, monkeypatch, capsys
):
    """Two cells of a session that loop until ``hvd_magic.stopping()``, each stopped from the
    panel's "stop gracefully" once it polls: each stops at a step boundary with its value. (The
    first cell's stop stayed agreed: the second cell stopped at its first poll, and was never
    heard to poll.)"""
    stops = recorded_stops(monkeypatch)
    session.run_line_magic("horovod", "start np=-2")
    loop = (
        "import hvd_magic, pathlib, time\n"
        "pathlib.Path({marks!r}, f'started-{{hvd.rank()}}').touch()\n"
        "step = 0\nwhile not hvd_magic.stopping():\n    step += 1\n    time.sleep(0.01)\nstep\n"
    )
    for cell in ("first", "second"):
        marks = tmp_path / cell
        marks.mkdir()

        def stop_once_polling() -> None:
            wait_until(lambda: bool(stops) and stops[-1].polls, 120)
            stops[-1].interrupt()  # the panel's stop: no signal, nothing left to arrive later

        when_started(marks, 2, stop_once_polling)
        assert session.run_cell_magic("horovod", "", loop.format(marks=str(marks))) > 0, cell
        assert "stopped on request" in capsys.readouterr().err, cell


def test_a_session_whose_ranks_died_is_ended_by_its_beat_and_a_start_makes_a_new_one(session):
    """Its processes gone by themselves, the session ends (its hub closed, its beat over), not
    only when a cell or a stop next touches it."""
    session.run_line_magic("horovod", "start np=-2")
    old = sessions.current()
    assert old is not None
    for info in old.ranks.values():
        os.kill(info.started.pid, signal.SIGKILL)
    assert old.wait_ended(120), "the session lived on with its ranks gone"
    assert re.search(r"rank \d( on \S+)? was killed by signal 9 \(SIGKILL\)", old.ended_because), (
        old.ended_because
    )
    session.run_line_magic("horovod", "start np=-2")
    assert sessions.current() is not old and sessions.current().live
    sessions.stop()
    assert leftover_processes() == []


def test_an_interrupt_keeps_the_state_and_np_on_a_cell_runs_apart_from_the_session(session, tmp_path, capsys):
    """(One session for both: a kernel has one session, and a cell with np= is a job of its own.)"""
    session.run_line_magic("horovod", "start np=-2")
    session.run_cell_magic("horovod", "", "import torch\nw = torch.tensor([hvd.rank() + 1.0])")
    with pytest.raises(UsageError, match="a live session is running"):
        session.run_line_magic("horovod", "start np=-2")
    session.run_cell_magic("horovod", "", "kept = 1")
    capsys.readouterr()
    assert session.run_cell_magic("horovod", "np=-2", "'kept' in globals()") is False  # a job of its own
    assert "np= makes this cell a job of its own" in capsys.readouterr().err
    assert session.run_cell_magic("horovod", "", "kept") == 1
    with pytest.raises(UsageError, match="usage: %horovod start"):
        session.run_line_magic("horovod", "frobnicate")
    waiting = f"import pathlib, time\npathlib.Path({str(tmp_path)!r}, f'started-{{hvd.rank()}}').touch()\n"
    waiting += "while True:\n    time.sleep(0.1)\n"
    pressed: list[float] = []
    when_started(tmp_path, 2, lambda: (pressed.append(time.monotonic()), os.kill(os.getpid(), signal.SIGINT)))
    with pytest.raises(RunInterrupted) as info:
        session.run_cell_magic("horovod", "", waiting)
    assert time.monotonic() - pressed[0] < 5
    assert any("state is kept" in note for note in info.value.__notes__)
    assert session.run_cell_magic("horovod", "", "hvd.allreduce(w, op=hvd.Sum).item()") == 3.0


def test_an_interrupt_inside_a_collective_returns_and_the_next_cell_starts_anew(session, tmp_path, capsys):
    """Before the interrupt, %horovod stacks (from another thread, the cell running) says where
    each rank is: rank 0 inside Horovod's allreduce from line 5 of the cell, rank 1 on line 4."""
    session.run_line_magic("horovod", "start np=-2")
    cell = "import pathlib, time, torch\n"
    cell += f"pathlib.Path({str(tmp_path)!r}, f'started-{{hvd.rank()}}').touch()\n"
    cell += "if hvd.rank() == 1:\n    time.sleep(3600)\nhvd.allreduce(torch.tensor([1.0]))"  # rank 0 is stuck
    pressed: list[float] = []
    seen: list[str] = []

    def look_then_interrupt() -> None:
        deadline = time.monotonic() + 60
        while not seen or ("from line 5 of the cell" not in seen[-1] and time.monotonic() < deadline):
            seen.append(sessions.stacks_text(sessions.current()))  # until rank 0 is in the allreduce
        session.run_line_magic("horovod", "stacks")  # the same, as a notebook prints it
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    when_started(tmp_path, 2, look_then_interrupt)
    with pytest.raises(RunInterrupted) as info:
        session.run_cell_magic("horovod", "", cell)
    where = seen[-1]
    assert re.search(r"^rank 0 on [^:]+: in \w+ \(mpi_ops\.py:\d+\), from line 5 of the cell$", where, re.M)
    assert "  line 5 of the cell: hvd.allreduce(torch.tensor([1.0]))" in where
    assert re.search(r"^rank 1 on [^:]+: in line 4 of the cell\n  line 4 of the cell: time", where, re.M)
    assert "from line 5 of the cell" in capsys.readouterr().out
    assert time.monotonic() - pressed[0] < 10
    # the session ended for the rank stuck in the collective: where it was, said in the note
    ended = next(note for note in info.value.__notes__ if "the live session ended" in note)
    assert "Where each rank was when the session ended:" in ended
    assert re.search(r"^rank 0 on [^:]+: in \w+ \(mpi_ops\.py:\d+\), from line 5 of the cell$", ended, re.M)
    assert any("the live session ended" in note for note in info.value.__notes__)
    assert wait_for_ranks(tmp_path, 2, timeout=1)
    assert session.run_cell_magic("horovod", "", "hvd.size()") == 2


def test_without_a_session_a_cell_needs_np(session):
    with pytest.raises(UsageError, match="np= is required"):
        session.run_cell_magic("horovod", "", "1")


def test_a_session_from_python_keeps_globals_between_calls():
    def build(scale):
        global w
        import horovod.torch as hvd
        import torch

        w = torch.tensor([hvd.rank() + 1.0]) * scale

    def total():
        import horovod.torch as hvd

        return hvd.allreduce(w, op=hvd.Sum).item()  # noqa: F821 - built by the call before

    def mine():
        return w.item()  # noqa: F821

    with Session(np=-2) as session:
        session.run(build, scale=2.0)
        assert session.run(total) == 6.0
        assert session.run(mine, ranks=[1]) == 4.0
        assert "2 ranks" in session.status()
    assert leftover_processes() == []


class Scaler:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def times(self, value: float) -> float:
        return self.factor * value

    def __call__(self, value: float) -> float:
        return self.factor + value


def test_a_session_from_python_runs_any_callable_and_refuses_ranks_it_has_not():
    """A partial, a callable object or a bound method ended the session (its ranks read the
    function's globals, or dropped ``self``); keyword-only defaults were lost; ranks=[5] on 2
    ranks ended the session too, and ranks=[0, 0] ran the function twice."""

    def scaled(value, *, by=3.0):
        return value * by

    def counted():
        global calls
        calls = globals().get("calls", 0) + 1
        return calls

    with Session(np=-2) as session:
        assert session.run(functools.partial(scaled, 2.0)) == 6.0
        assert session.run(Scaler(2.0).times, value=5.0) == 10.0
        assert session.run(Scaler(2.0), value=5.0) == 7.0
        assert session.run(scaled, value=1.0) == 3.0
        for ranks_, said in [
            ([5], "the live session has ranks 0 to 1; '5' names others"),
            ([], "ranks=\\[\\] names no rank"),
            ("0", "ranks takes a list of rank numbers"),
        ]:
            with pytest.raises(ValueError, match=said):
                session.run(scaled, value=1.0, ranks=ranks_)
        assert session.run(counted, ranks=[1, 1]) == 1  # once on rank 1
        assert session.run(counted, ranks=1) == 2
    assert leftover_processes() == []


def test_ranks_leave_only_after_many_beats_were_missed(monkeypatch):

    for limit, beat in ((20.0, 1.0), (4.0, 0.5), (2.0, 0.25)):
        monkeypatch.setattr(ranks, "SILENCE_SECONDS", limit)
        assert ranks.beat_interval() == beat and limit / ranks.beat_interval() >= ranks.BEATS_PER_SILENCE


def test_a_set_up_longer_than_the_silence_limit_keeps_its_ranks(monkeypatch):
    """The session beats its ranks from their first moment, not only once the set-up cell
    (imports, hvd.init: seconds on a busy machine) is done: a set-up twice the silence limit
    long would otherwise have its ranks leave, taking the notebook for gone. (A 2 s limit at
    one beat a second failed a loaded full run: two late beats. The beat is now a fraction of
    the limit.)"""

    monkeypatch.setattr(ranks, "SILENCE_SECONDS", 4.0)
    slow = ranks.setup_source
    monkeypatch.setattr(ranks, "setup_source", lambda options: "import time\ntime.sleep(8)\n" + slow(options))

    def where() -> int:
        import os

        return os.getpid()

    with Session(np=-2) as session:
        assert session.run(where) != os.getpid()
    assert leftover_processes() == []
    with pytest.raises(SessionEnded, match=r"the session ended \(it was stopped\): start a new Session"):
        session.run(where)


def test_idle_counts_from_the_end_of_the_set_up_and_then_ends_the_session(monkeypatch):
    """``idle=`` ends a session that no cell used for that long, and says so. The set-up cell is
    not idleness: a set-up longer than the limit once ended the session before it was ready."""

    slow = ranks.setup_source
    monkeypatch.setattr(ranks, "setup_source", lambda options: "import time\ntime.sleep(4)\n" + slow(options))
    session = Session(np=-2, idle=2)
    try:
        assert session.run(lambda: 6 * 7) == 42
        assert session.wait_ended(60)  # no cell since: the beat ends it
        with pytest.raises(RunError, match=r"idle for 2 s \(idle=\)"):
            session.run(lambda: 1)
    finally:
        session.stop()
    assert leftover_processes() == []


def test_a_cell_holds_the_session_against_an_idle_end_or_finds_it_ended(monkeypatch):
    """The race of a cell against the beat that ends an idle session, over many cells: a cell
    that claimed the session keeps it to its end (the idle end waits), and one that came after
    the end is refused with the reason, having run nowhere. The session's hub and launcher are
    in-memory stand-ins: this is the lock protocol alone (the test above runs real ranks)."""
    monkeypatch.setattr(ranks, "beat_interval", lambda: 0.0005)

    def clock() -> float:  # a slow clock: what the session does around it takes long enough for
        time.sleep(0.001)  # the other thread to come in (the beat's idle check, a cell's end)
        return time.monotonic()

    total = 0
    for _ in range(20):
        stopped: list[float] = []
        launcher = SimpleNamespace(
            poll=lambda: None,
            exited=dict,  # none of its ranks ended
            stop=lambda stopped=stopped: stopped.append(time.monotonic()) or [],
        )
        session = live.LiveSession(make_options(np=-2), idle=0.003, launcher=launcher, clock=clock)
        session.hub = SimpleNamespace(close=lambda: None, send_to=lambda *args: None)
        with session.claim():  # the set-up cell: the beat starts under it, as in start()
            threading.Thread(target=session.beat, daemon=True).start()
            last_end = time.monotonic()
        claims = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with session.claim():
                    claims += 1
                    held = time.monotonic() + 0.004 * (claims % 3)  # some cells outlast idle=
                    while time.monotonic() < held:
                        assert not session.ended, "the session ended under a running cell"
                    assert not session.ended, "the session ended under a running cell"
                    last_end = time.monotonic()
            except SessionEnded as refused:
                assert "idle for 0.003 s (idle=)" in str(refused)
                break
            time.sleep(0.001 * (claims % 7))  # idle gaps, some longer than idle=
        else:
            pytest.fail("the idle session never ended")
        assert session.ended and stopped[0] - last_end >= 0.003, "ended sooner than idle= after a cell"
        total += claims
    assert total > 0


def test_a_session_cell_names_a_run_stopped_from_outside_as_its_sessions_launcher_does():
    """Spark cancelled the session's job while a cell ran: the cell's launcher passes the word on
    (the run's failure, no rank's), and the session says why it is over."""
    word = "Spark cancelled the run's tasks (Job 3 cancelled as part of cancellation of all jobs)"
    under = ScriptedLauncher(code=1)
    under.ended_by = word
    session = live.LiveSession(make_options(np=-2), launcher=under)
    cell = CellLauncher(session, Cell(1), [0, 1], b"")
    assert cell.ended_by == word
    assert cell.poll() == 1 and session.lost == word


def test_an_interrupt_while_a_session_starts_before_a_rank_spoke_stops_the_start():
    """The notebook's interrupt during ``%horovod start``, before any rank was heard from (a slow
    Spark executor): the start ends in RunInterrupted and its processes are stopped (asking the
    unheard ranks to leave the set-up cell raised a KeyError instead)."""
    launcher = ScriptedLauncher(on_poll=[nothing, lambda hub: signal.raise_signal(signal.SIGINT)], code=None)
    session = live.LiveSession(make_options(np=-2), launcher=launcher)
    with pytest.raises(RunInterrupted, match="interrupted"):
        session.start(RecordingView())
    assert launcher.stops >= 1 and session.ended


def test_an_interrupt_during_a_sessions_stop_does_not_cut_it_short():
    """``%horovod stop`` (or any end) of a session whose stop is slow (Spark's): an interrupt
    meanwhile waits for it, so the hub is closed; cut short, the session was marked ended with
    its hub open for good (no later end did anything)."""
    launcher = ScriptedLauncher(on_stop=[lambda hub: signal.raise_signal(signal.SIGINT)], code=None)
    session = live.LiveSession(make_options(np=-2), launcher=launcher)
    closed: list[bool] = []
    session.hub = SimpleNamespace(close=lambda: closed.append(True))
    launcher.hub = session.hub
    try:
        assert session.end() == [] and closed == [True] and launcher.stops == 1
    except KeyboardInterrupt:
        pytest.fail("the interrupt cut the session's stop short")


def test_a_cell_that_meets_an_idle_end_runs_on_a_new_session(session, capsys):
    """A cell past the magic's "is it live" check when idle= ends the session: it ran nowhere,
    so it runs on a new session, said as such, instead of failing."""
    session.run_line_magic("horovod", "start np=-2 idle=2")
    old = sessions.current()
    assert old is not None and old.wait_ended(60)  # no cell: the beat ends it
    packed = pack_cell("import os\nos.getpid()\n", session.user_ns)
    value, _ = sessions.run_on(old, packed, None, old.options)
    new = sessions.current()
    assert new is not old and new is not None and value == new.ranks[0].started.pid
    assert "the live session ended (idle for 2 s (idle=)); starting a new one" in capsys.readouterr().err


def test_status_shows_each_ranks_gpu_figures_where_ranks_have_one():
    """%horovod status adds a GPU column (NVML's utilisation, memory, temperature) only when a
    rank reports a GPU; a rank without one (-1) leaves its cell empty."""
    from hvd_magic.protocol import RankStatus, Started
    from hvd_magic.session.ranks import RankInfo

    with_gpu = RankStatus(rss=2**30, cpu=50.0, gpu=37.0, gpu_memory=3 * 2**29, gpu_memory_total=141 * 2**30,
                          gpu_temperature=45.0)  # fmt: skip
    infos = {
        0: RankInfo(started=Started(host="gpu-host", pid=11, local_rank=0, size=2), status=with_gpu),
        1: RankInfo(started=Started(host="cpu-host", pid=12, local_rank=0, size=2), status=RankStatus()),
    }
    session = SimpleNamespace(live=True, size=2, began=time.monotonic(), ranks=infos,
                              options=SimpleNamespace(launcher="gloo"), refresh=lambda: None)  # fmt: skip
    header, gpu_rank, cpu_rank = sessions.status_text(session).splitlines()[1:]  # type: ignore[arg-type]
    assert header.endswith("gpu") and gpu_rank.endswith("37 %, 1.5/141 GB, 45 °C")
    assert "GB" not in cpu_rank and cpu_rank.rstrip().endswith("%")
    infos[0] = RankInfo(started=infos[0].started, status=RankStatus())
    assert "gpu" not in sessions.status_text(session).splitlines()[1]  # type: ignore[arg-type]


def test_a_rank_whose_python_cannot_run_is_shown_by_py_spy(session, tmp_path):
    """A C call that holds Python's lock (libc's sleep through ctypes.PyDLL): the rank cannot
    answer; py-spy (hvd_magic[debug]) dumps it from the notebook, native frames and the cell's."""
    session.run_line_magic("horovod", "start np=-2 backend=torch")
    cell = "import ctypes, os, pathlib\n"
    cell += f"pathlib.Path({str(tmp_path)!r}, 'started-' + os.environ['RANK']).touch()\n"
    cell += "if int(os.environ['RANK']) == 1:\n    ctypes.PyDLL(None).sleep(15)\n'done'"
    seen: list[str] = []

    def look() -> None:  # while the cell runs
        deadline = time.monotonic() + 60
        while not seen or ("lock); py-spy dump" not in seen[-1] and time.monotonic() < deadline):
            seen.append(sessions.stacks_text(sessions.current()))  # rank 1 may not be asleep yet

    when_started(tmp_path, 2, look)
    assert session.run_cell_magic("horovod", "", cell) == "done"
    where = seen[-1]
    assert re.search(
        r"^rank 1 on [^:]+: no answer from its Python \(a C call holds its lock\); py-spy dump --native:$",
        where,
        re.M,
    )
    assert "sleep (libc" in where and "<horovod cell>:4" in where, where
    assert re.search(r"^rank 0 on [^:]+: idle$", where, re.M), where  # done with the cell
