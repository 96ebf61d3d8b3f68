"""A run's supervision, driven by an in-memory hub and a scripted launcher: no processes,
no sockets, a clock that steps (the real launchers are tested end to end elsewhere)."""

from __future__ import annotations

import json
import os

import cloudpickle
import pytest

from hvd_magic import LaunchError, RankFailedError, RunError, RunInterrupted, RunTimeout
from hvd_magic.errors import FailureClass
from hvd_magic.launch.processes import death_of
from hvd_magic.options import make_options
from hvd_magic.protocol import (
    ENV_HUB,
    ENV_TOKEN,
    Exit,
    FileChunk,
    Log,
    RankError,
    Result,
    Stall,
    Started,
    Waiting,
)
from hvd_magic.run import supervisor as run_supervisor
from hvd_magic.run import timeouts
from hvd_magic.run.supervisor import DRAIN_SECONDS, SETTLE_SECONDS, Run
from hvd_magic.widgets.state import RunModel

from .fakes import FakeHub, ScriptedLauncher, SteppingClock, healthy_rank, nothing, send
from .helpers import RecordingView

pytestmark = pytest.mark.timeout(10)
SHUT_DOWN = RankError("vm", "HorovodInternalError", "Horovod has been shut down")
# two ranks start on host a, and Horovod shuts down under rank 0 (rank 1 died without a word)
SHUT_DOWN_UNDER_RANK_0 = [send(0, Started("a", 1, 0, 2)), send(1, Started("a", 2, 1, 2)), send(0, SHUT_DOWN)]


def run(
    launcher: ScriptedLauncher,
    timeout: float | None = None,
    timeline: str | None = None,
    ranks: int = 2,
    step: float = 1.0,
):
    hub, view = FakeHub(), RecordingView()
    options = make_options(np=-ranks, launcher="gloo", timeout=timeout, timeline=timeline)
    supervisor = Run(hub, launcher, view, options, clock=SteppingClock(step))
    supervisor.wait = 0.001
    return supervisor, hub, view


def test_rank0s_value_comes_back_and_everything_is_closed():
    launcher = ScriptedLauncher(on_start=healthy_rank(0, value=42) + healthy_rank(1))
    supervisor, hub, view = run(launcher)
    assert supervisor.supervise() == (42, {})
    assert launcher.stops == 1 and hub.closed and view.closed
    assert len(view.messages) == 5
    assert launcher.env[ENV_HUB] == hub.address and launcher.env[ENV_TOKEN] == hub.keys.client_token()


def test_a_smaller_run_that_ended_is_not_run_again_to_grow():
    """min_np=: the slots came back as the smaller run's ranks sent its value and exited, while
    its job still ended (a Spark stage takes a moment): the value is the run's (it was thrown
    away and the cell run again at full size)."""
    launcher = ScriptedLauncher(
        on_start=healthy_rank(0, value="done") + healthy_rank(1), on_poll=[nothing] * 5
    )
    supervisor, _, _ = run(launcher)
    supervisor.grow = lambda: True  # a checkpoint landed, and the slots are back
    assert supervisor.supervise() == ("done", {})


def test_messages_in_flight_when_the_launcher_ends_are_drained():
    late = healthy_rank(1)
    launcher = ScriptedLauncher(on_start=healthy_rank(0, value="done"), code=0)
    launcher.on_poll = []  # the launcher says "ended" at once; rank 1's messages arrive after
    supervisor, hub, view = run(launcher)
    for step in late:
        step(hub)
    assert supervisor.supervise() == ("done", {})


def test_a_launcher_that_ends_before_rank1_exits_waits_for_it_then_says_it_died():
    launcher = ScriptedLauncher(on_start=[*healthy_rank(0, value=1), send(1, Started("h", 2, 1, 2))], code=1)
    supervisor, _, _ = run(launcher)
    with pytest.raises(RunError, match=r"ranks \[1\] died without reporting"):
        supervisor.supervise()


CANCELLED_WORD = "Spark cancelled the run's tasks (Job 3 cancelled as part of cancellation of all jobs)"


@pytest.mark.parametrize(
    ("seen", "said"),
    [
        ({"seen_deaths": [death_of(1, -9, "h")]}, r"rank 1 was killed by signal 9"),
        ({"ended_by": CANCELLED_WORD}, r"^the run was stopped: Spark cancelled"),  # its tasks went
    ],
    ids=["a-death-the-launcher-saw", "the-run-stopped-from-outside"],
)
def test_the_drain_does_not_wait_for_ranks_that_ended_without_a_word(seen, said):
    """A killed rank, or the ranks of a run Spark cancelled, send nothing more: not waited for."""
    launcher = ScriptedLauncher(on_start=[*healthy_rank(0, value=1), send(1, Started("h", 2, 1, 2))], code=1)
    for name, value in seen.items():
        setattr(launcher, name, value)
    clock = SteppingClock(0.05)
    began = clock.now
    supervisor = Run(FakeHub(), launcher, RecordingView(), make_options(np=-2, launcher="gloo"), clock=clock)
    supervisor.wait = 0.001
    with pytest.raises(RunError, match=said):
        supervisor.supervise()
    assert clock.now - began < DRAIN_SECONDS


def test_a_run_whose_ranks_all_said_their_exit_ends_without_settling():
    """The settle is for a rank that died without a word; a healthy run (every session cell, every
    cold cell) ends as soon as each rank's exit is in (it waited 0.25 s at every end: issue 77)."""
    launcher = ScriptedLauncher(on_start=healthy_rank(0, value=7) + healthy_rank(1), code=0)
    clock = SteppingClock(0.001)  # each read 1 ms: the old settle took >= 250 reads
    began = clock.now
    supervisor = Run(FakeHub(), launcher, RecordingView(), make_options(np=-2, launcher="gloo"), clock=clock)
    supervisor.wait = 0.001
    assert supervisor.supervise() == (7, {})
    assert clock.now - began < SETTLE_SECONDS / 4


class DeathsCounted(ScriptedLauncher):
    asked = 0

    def deaths(self):  # type: ignore[no-untyped-def]
        self.asked += 1
        return super().deaths()


def test_a_clean_end_asks_the_launcher_for_no_deaths():
    """A Spark launcher's deaths ask Spark (eight JVM calls): a live cell on Spark spent 2.5 ms of
    its 5 in them, twice a cell. A run whose ranks all said their exit needs no such word."""
    launcher = DeathsCounted(on_start=healthy_rank(0, value=3) + healthy_rank(1), code=0)
    supervisor, _, _ = run(launcher)
    assert supervisor.supervise() == (3, {})
    assert launcher.asked == 0


def test_what_a_killed_rank_sent_just_before_it_died_is_still_read():
    """A rank the launcher saw die: what it sent on its way out arrives after the launcher ended."""
    launcher = ScriptedLauncher(on_start=[*healthy_rank(0, value=1), send(1, Started("h", 2, 1, 2))], code=1)
    launcher.seen_deaths = [death_of(1, -9, "h")]
    hub, view = FakeHub(), RecordingView()
    clock = SteppingClock(0.01)  # the settle spans ~25 clock reads
    supervisor = Run(hub, launcher, view, make_options(np=-2, launcher="gloo"), clock=clock)
    supervisor.wait = 0.001
    hub.put_after(hub.events.reads + 8, 1, Log())
    with pytest.raises(RunError, match=r"rank 1 was killed by signal 9"):
        supervisor.supervise()
    assert any(isinstance(message.record, Log) for message in view.messages)


def test_the_cause_arriving_after_a_consequence_is_named():
    launcher = ScriptedLauncher(
        on_start=[send(0, Started("a", 1, 0, 2)), send(1, Started("b", 2, 1, 2)), send(0, SHUT_DOWN)],
        code=None,
    )
    supervisor, hub, _ = run(launcher, step=0.1)  # the 3 s grace spans ~30 clock reads
    reads = hub.events.reads
    hub.put_after(reads + 8, 1, RankError("b", "ValueError", "bad shard"))  # still on its way
    with pytest.raises(RankFailedError) as info:
        supervisor.supervise()
    assert info.value.rank == 1 and info.value.exc_type == "ValueError" and info.value.host == "b"
    assert launcher.stops >= 1


def test_a_silent_death_seen_by_the_launcher_is_named():
    launcher = ScriptedLauncher(
        on_start=SHUT_DOWN_UNDER_RANK_0, code=None, seen_deaths=[death_of(1, -9, "a")]
    )
    supervisor, _, view = run(launcher)
    said = r"rank 1 on a failed \(killed from outside\): it was killed by signal 9"
    with pytest.raises(RankFailedError, match=said):
        supervisor.supervise()
    model = RunModel(2)  # the live view's, and the kernel's record's: rank 1 failed, not running
    for message in view.messages:
        model.apply(message)
    assert [p.state for p in model.progress] == ["failed", "failed"]


class StopKills(ScriptedLauncher):
    """A local launcher's deaths: after its stop, every rank it stopped has died too."""

    def stop(self) -> list[str]:
        self.seen_deaths.append(death_of(0, -15, "a"))  # rank 0: stopped by the run, not failed
        return super().stop()


def test_only_the_ranks_dead_before_the_stop_are_shown_failed():
    launcher = StopKills(on_start=SHUT_DOWN_UNDER_RANK_0, code=None, seen_deaths=[death_of(1, -9, "a")])
    supervisor, _, view = run(launcher)
    with pytest.raises(RankFailedError, match="rank 1 on a failed"):
        supervisor.supervise()
    dead = [m.rank for m in view.messages if isinstance(m.record, Exit) and m.record.code == -1]
    assert dead == [1]


def test_a_run_stopped_from_outside_is_the_runs_failure_though_every_rank_spoke_first():
    """Spark cancelled the job: each rank saw its peers go and said so before the launcher's word."""
    started = [send(0, Started("a", 1, 0, 2)), send(1, Started("b", 2, 1, 2))]
    launcher = ScriptedLauncher(on_start=[*started, send(0, SHUT_DOWN), send(1, SHUT_DOWN)], code=None)
    launcher.ended_by = (
        "Spark cancelled the run's tasks (Job 3 cancelled as part of cancellation of all jobs)"
    )
    supervisor, _, view = run(launcher)
    with pytest.raises(RunError) as info:
        supervisor.supervise()
    assert not isinstance(info.value, RankFailedError) and info.value.failure is FailureClass.CANCELLED
    assert str(info.value) == f"the run was stopped: {launcher.ended_by}; its ranks ended with it"
    assert "hvd_magic: the run failed (cancelled in Spark)" in view.notices


def test_a_consequence_alone_is_reported_after_the_grace():
    launcher = ScriptedLauncher(on_start=[send(0, Started("a", 1, 0, 2)), send(0, SHUT_DOWN)], code=None)
    supervisor, _, _ = run(launcher)
    with pytest.raises(RankFailedError) as info:
        supervisor.supervise()
    assert info.value.rank == 0 and info.value.exc_type == "HorovodInternalError"


def test_silence_beyond_the_timeout_ends_the_run_naming_the_silent_ranks():
    launcher = ScriptedLauncher(
        on_start=[send(0, Started("a", 1, 0, 2)), send(1, Started("a", 2, 1, 2))], code=None
    )
    supervisor, _, _ = run(launcher, timeout=30)
    with pytest.raises(
        RunTimeout, match=r"no rank reported anything for 30 s.*Silent: rank 0 for \d+ s, rank 1"
    ) as timed_out:
        supervisor.supervise()
    assert launcher.stops >= 1
    # where each was: these ranks never opened their inbox, so they could not be asked; they are
    # on another host than this one, so py-spy is for their host, with each one's pid
    said = str(timed_out.value)
    assert "Where each rank was at the timeout:\nrank 0 on a: no answer (a C call holding" in said
    assert "`py-spy dump --native --pid 1` on its host" in said and "--pid 2`" in said


def test_ranks_that_never_start_end_the_run_after_the_start_timeout():
    launcher = ScriptedLauncher(on_start=[send(0, Started("a", 1, 0, 2))], code=None)
    supervisor, _, _ = run(launcher)
    supervisor.start_limit = 50.0  # each run's HVD_MAGIC_START_TIMEOUT (test_faults sets it)
    with pytest.raises(RunTimeout, match=r"ranks \[1\] did not start within 50 s"):
        supervisor.supervise()


@pytest.mark.parametrize("text", ["10m", "0", "nan", ""])
def test_a_start_timeout_that_is_no_number_of_seconds_is_named(monkeypatch, text):
    """``HVD_MAGIC_START_TIMEOUT=10m`` once broke hvd_magic's import (read when loaded)."""
    monkeypatch.setenv("HVD_MAGIC_START_TIMEOUT", text)
    with pytest.raises(LaunchError, match=f"HVD_MAGIC_START_TIMEOUT={text!r}: say how many seconds"):
        timeouts.start_limit()


def test_a_launch_slower_than_the_timeout_is_judged_by_the_start_timeout():
    launcher = ScriptedLauncher(code=None)  # no rank has started: not a hang yet
    supervisor, _, _ = run(launcher, timeout=5)
    supervisor.start_limit = 50.0
    with pytest.raises(RunTimeout, match=r"ranks \[0, 1\] did not start within 50 s"):
        supervisor.supervise()


def test_stall_reports_do_not_hold_off_the_timeout_and_are_named_by_it():
    stall = Stall([0], [["allreduce.t3"]], 15.0)
    launcher = ScriptedLauncher(
        on_start=[send(0, Started("a", 1, 0, 2)), send(1, Started("a", 2, 1, 2))],
        on_poll=[send(0, stall)] * 200,  # Horovod repeating its warning, far beyond the timeout
        code=None,
    )
    supervisor, _, view = run(launcher, timeout=30)
    with pytest.raises(RunTimeout, match=r"Horovod says it stalled: rank 0 never submitted allreduce.t3"):
        supervisor.supervise()
    assert any(m.record == stall for m in view.messages)  # the view got it too


def test_torch_ranks_waiting_for_one_that_left_end_the_run_naming_it():
    waiting = Waiting("init_process_group", "line 4 of the cell", 2.0)
    launcher = ScriptedLauncher(
        on_start=[send(0, Started("a", 1, 0, 2)), send(1, Started("a", 2, 1, 2))],
        on_poll=[send(0, waiting), nothing, nothing, send(1, Exit(0))] + [nothing] * 100,
        code=None,
    )
    supervisor, _, view = run(launcher)
    with pytest.raises(RankFailedError) as info:
        supervisor.supervise()
    assert info.value.rank == 1
    assert "rank 1 on a failed: it finished without reaching init_process_group (line 4 of the cell)" in str(
        info.value
    )
    stalls = [m.record for m in view.messages if isinstance(m.record, Stall)]
    assert stalls == [Stall([1], [["init_process_group (line 4 of the cell)"]], 15.0, "reached", "")]


def test_a_torch_stall_is_told_once_and_forgotten_when_the_wait_ends():
    waiting = Waiting("all_reduce", "line 5 of the cell", 2.0)
    launcher = ScriptedLauncher(
        on_start=[send(0, Started("a", 1, 0, 2)), send(1, Started("a", 2, 1, 2))],
        on_poll=[send(0, waiting)]
        + [nothing] * 30
        + [send(0, Waiting())]
        + healthy_rank(0, 7)
        + healthy_rank(1),
        code=0,
    )
    supervisor, _, view = run(launcher)
    assert supervisor.supervise() == (7, {})
    stalls = [m.record for m in view.messages if isinstance(m.record, Stall)]
    assert stalls == [Stall([1], [["all_reduce (line 5 of the cell)"]], 15.0, "reached", "")]
    assert supervisor.record.stall is None


def test_an_interrupt_stops_the_launcher_and_closes_everything():
    def interrupt(hub: FakeHub) -> None:
        raise KeyboardInterrupt

    launcher = ScriptedLauncher(on_start=healthy_rank(0)[:1], on_poll=[nothing, interrupt], code=None)
    supervisor, hub, view = run(launcher)
    with pytest.raises(RunInterrupted, match="the 2 ranks were stopped"):
        supervisor.supervise()
    assert launcher.stops == 1 and hub.closed and view.closed


def test_a_second_interrupt_while_the_ranks_stacks_are_asked_does_not_skip_the_stop(monkeypatch):
    """A quiet run interrupted asks each rank where it is (seconds, with py-spy); the user, as the
    docs invite, interrupts again meanwhile: the launcher is still stopped and the hub closed
    (the second one escaped as a KeyboardInterrupt and left the ranks running)."""
    import signal

    def interrupt(hub: FakeHub) -> None:
        raise KeyboardInterrupt

    def asked_where(*args: object) -> str:
        signal.raise_signal(signal.SIGINT)  # the second interrupt, while the stacks are asked
        return "\nWhere each rank was when interrupted: ..."

    monkeypatch.setattr(run_supervisor, "where_each_rank", asked_where)
    launcher = ScriptedLauncher(on_start=healthy_rank(0)[:1], on_poll=[nothing, interrupt], code=None)
    supervisor, hub, view = run(launcher, step=60.0)  # a minute a clock read: the run is quiet
    try:
        with pytest.raises(RunInterrupted, match="Where each rank was when interrupted"):
            supervisor.supervise()
    except KeyboardInterrupt:
        pytest.fail("the second interrupt escaped the stop")
    assert launcher.stops == 1 and hub.closed and view.closed


def test_the_error_says_what_could_not_be_stopped():
    launcher = ScriptedLauncher(
        on_start=[send(0, Started("a", 1, 0, 2)), send(1, RankError("b", "ValueError", "bad"))],
        code=None,
        leftovers=["4242: python -m hvd_magic.rank.worker (executor 1)"],
    )
    supervisor, _, _ = run(launcher)
    with pytest.raises(RankFailedError) as info:
        supervisor.supervise()
    assert info.value.__notes__ == [
        "still being stopped after the run: 4242: python -m hvd_magic.rank.worker (executor 1)"
    ]
    assert info.value._render_traceback_()[-1] == info.value.__notes__[0]  # shown in the notebook


def test_a_successful_run_with_leftovers_says_so_and_still_returns_its_value():
    launcher = ScriptedLauncher(on_start=healthy_rank(0, value=7) + healthy_rank(1), leftovers=["99: orted"])
    supervisor, _, view = run(launcher)
    assert supervisor.supervise() == (7, {})
    assert view.notices == ["hvd_magic: still being stopped after the run: 99: orted"]


def test_the_stop_comes_once_after_the_decision_and_the_last_output_still_reaches_the_view():
    launcher = ScriptedLauncher(
        on_start=[send(0, Started("a", 1, 0, 2)), send(1, RankError("b", "ValueError", "bad"))],
        on_stop=[send(0, Log("stderr"), b"KeyboardInterrupt\n")],  # what the stop makes rank 0 say
        code=None,
    )
    supervisor, _, view = run(launcher)
    with pytest.raises(RankFailedError) as info:
        supervisor.supervise()
    assert info.value.rank == 1 and launcher.stops == 1
    assert view.messages[-1].blob == b"KeyboardInterrupt\n" and view.closed


def test_a_value_the_notebook_cannot_load_is_a_clear_error():
    broken = [
        send(0, Started("a", 1, 0, 1)),
        send(0, Result(), b"not a pickle"),
        send(0, Exit(0)),
    ]
    supervisor, _, _ = run(ScriptedLauncher(on_start=broken), ranks=1)
    with pytest.raises(RunError, match="could not be loaded in the notebook"):
        supervisor.supervise()


def test_rank0s_timeline_chunks_are_written_where_the_user_asked(tmp_path):
    path = tmp_path / "timeline.json"
    steps = [
        send(0, Started("a", 1, 0, 1)),
        send(0, FileChunk("timeline"), b'{"ph": "B"}'),
        send(0, Log("stdout"), b"unrelated\n"),
        send(0, FileChunk("timeline"), b'{"ph": "E"},\n{"ph": "i", "args": {"s": "}]"}}'),
        send(0, FileChunk("timeline", last=True)),
        send(0, Result(), cloudpickle.dumps((None, {}))),
        send(0, Exit(0)),
    ]
    supervisor, _, _ = run(ScriptedLauncher(on_start=steps), timeline=str(path), ranks=1)
    supervisor.supervise()
    assert [event["ph"] for event in json.loads(path.read_text())] == ["B", "E", "i"]


def test_a_timeline_whose_last_chunk_never_came_is_closed_when_the_run_ends(tmp_path):
    path = tmp_path / "timeline.json"
    steps = [
        send(0, Started("a", 1, 0, 1)),
        send(0, FileChunk("timeline"), b'{"ph": "B"}'),
        send(0, Result(), cloudpickle.dumps((None, {}))),
        send(0, Exit(0)),
    ]
    supervisor, _, _ = run(ScriptedLauncher(on_start=steps), timeline=str(path), ranks=1)
    supervisor.supervise()
    assert json.loads(path.read_text()) == [{"ph": "B"}]


def test_files_rank0_sends_land_in_the_runs_folder_whole_and_nowhere_else(tmp_path):
    steps = [
        send(0, Started("a", 1, 0, 2)),
        send(0, FileChunk("checkpoint-0001.pt"), b"ab"),
        send(0, FileChunk("checkpoint-0001.pt", last=True), b"cd"),
        send(0, FileChunk("half.pt"), b"never finished"),
        send(0, FileChunk("../escape.pt", last=True), b"x"),
        send(0, FileChunk("x/../../escape.pt", last=True), b"x"),
        send(1, FileChunk("from-rank-1.pt", last=True), b"x"),
        send(0, Result(), cloudpickle.dumps((None, {}))),
        send(0, Exit(0)),
        send(1, Started("a", 2, 1, 2)),
        send(1, Exit(0)),
    ]
    supervisor, _, _ = run(ScriptedLauncher(on_start=steps))
    (tmp_path / "files").mkdir()
    supervisor.files.files_dir = str(tmp_path / "files")
    supervisor.supervise()
    assert sorted(os.listdir(tmp_path / "files")) == ["checkpoint-0001.pt", "half.pt.partial"]
    assert (tmp_path / "files" / "checkpoint-0001.pt").read_bytes() == b"abcd"
    assert not (tmp_path / "escape.pt").exists()
