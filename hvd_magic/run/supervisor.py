"""One run, whatever started it (``%%horovod`` or ``HorovodRunner``): ``run_on_ranks`` picks the launcher
(``launch.create``), starts the hub with the payload, and hands both to a ``Run``, which feeds the
ranks' messages to a view and turns the outcome into rank 0's value or one clear exception
(``diagnosis`` says which). ``Run`` knows neither which launcher nor which view it has."""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from hvd_magic import launch
from hvd_magic.errors import RunError, RunInterrupted
from hvd_magic.hub import Hub
from hvd_magic.launch import Launcher
from hvd_magic.options import RunOptions
from hvd_magic.protocol import Beat, Exit, Message, ResumeRequest
from hvd_magic.run import diagnosis, stalls, timeouts
from hvd_magic.run.checkpoint_store import CheckpointStore
from hvd_magic.run.graceful import GracefulStop, interrupts_deferred
from hvd_magic.run.packing import Packed
from hvd_magic.run.prompts import RankPrompts
from hvd_magic.run.rank_env import rank_env, stall_seconds
from hvd_magic.run.rank_files import RankFiles
from hvd_magic.run.record import RunRecord
from hvd_magic.run.recording import recorded_sinks
from hvd_magic.run.resize import SlotsBack
from hvd_magic.run.retry import Attempts, HeldView
from hvd_magic.run.stacks import where_each_rank
from hvd_magic.run.stragglers import StragglerWatch
from hvd_magic.run.views import RunView, make_view, timeline_notice
from hvd_magic.sinks import Sinks
from hvd_magic.timeline.live import live_timeline

__all__ = ["Run", "run_on_ranks"]

DRAIN_SECONDS = 5.0  # after the launcher exits: how long to wait for messages still in flight
SETTLE_SECONDS = 0.25  # ... and at least this long, for what a rank sent just before it died
PUMP_BATCH = 2000
BEAT_SECONDS = 1.0
CAUSE_GRACE = 3.0  # seconds to look for the cause behind a "Horovod has been shut down" error
QUIET_SECONDS = 10.0  # an interrupt after this long without a message also says where each rank was


def run_on_ranks(
    packed: Packed, options: RunOptions, view: RunView | None = None, hosts: dict[int, str] | None = None
) -> Any:
    """Run the payload on ``options.np`` ranks; return rank 0's value (and returned names).
    ``hosts``, if given, gets each rank's host (of the last attempt), whatever the outcome."""
    with recorded_sinks(options) as sinks:  # TensorBoard, MLflow, the kernel's record: messages, outcome
        return sinks.returned(_attempts(packed, options, view, sinks, {} if hosts is None else hosts))


def _attempts(
    packed: Packed, options: RunOptions, view: RunView | None, sinks: Sinks, hosts: dict[int, str]
) -> Any:
    view = sinks.shown_in(view or make_view(options.ranks))
    for text in [*options.notices, *packed.notices, *timeline_notice(options.timeline)]:
        view.notice(text)
    store = CheckpointStore(options.checkpoint_dir)
    attempts = Attempts(options, view, store, launch.slots_now)
    shown = HeldView(view) if options.retries else view
    create = functools.partial(launch.create, imports=packed.imports)  # which ranks are forked: warm.choice
    try:
        while True:
            try:
                launcher = attempts.launcher(create, limit := timeouts.start_limit())
            except KeyboardInterrupt:
                raise attempts.interrupted() from None
            for text in launcher.notices:
                view.notice(text)
            run = Run(Hub(launcher.bind_host, packed.blob), launcher, shown, attempts.options, store, sinks)
            run.grow, run.start_limit = attempts.sizes.grow_check(), limit
            try:
                value = run.supervise()
            except BaseException as err:  # noqa: BLE001 - raised again unless the run may start again
                attempts.failed(err)
                continue
            finally:
                hosts.clear()
                hosts.update(run.record.started)
            attempts.succeeded()
            return value
    finally:
        store.discard()
        if shown is not view:
            view.close()


class Run:
    """Supervises one started launcher: messages to the view, time limits, the outcome."""

    wait = 0.1  # seconds the loop waits for a message before it polls the launcher
    keeps_hub = False  # a live session's cell: the hub outlives the run
    beats = True  # ask the ranks for their resources every BEAT_SECONDS (a session beats itself)
    grow: Callable[[], bool] | None = None  # a smaller run (min_np=): stop now, the slots are back?
    start_limit = 300.0  # seconds the ranks have to start (HVD_MAGIC_START_TIMEOUT, read at each run)

    def __init__(
        self,
        hub: Hub,
        launcher: Launcher,
        view: RunView,
        options: RunOptions,
        store: CheckpointStore | None = None,
        sinks: Sinks | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub, self.launcher, self.view, self.options, self.clock = hub, launcher, view, options, clock
        self.sinks = sinks or Sinks()
        self.record = RunRecord(options.ranks, began=(now := clock()), last_message=now)
        self.files = RankFiles(options.timeline, options.files_dir, store, hub.send_to)
        self.stopper = GracefulStop(hub, view, store, clock)
        self.prompts = RankPrompts(hub, view, self.record.started)
        self.last_beat = now
        if store is not None:
            hub.responders[ResumeRequest] = store.answer
        self.stall_seconds = stall_seconds(options)
        self.stall_shown: float | None = None
        self.stragglers = StragglerWatch(options.stragglers)
        self.live_timeline = live_timeline(options.timeline, view, self.files.writing_timeline, options.env)
        self.sinks.supervising(self)  # the kernel's record: the Horovod panel's stop and stacks

    def supervise(self) -> Any:
        """Start and supervise; then stop whatever is left and return (or raise) only once the
        run's processes are gone, or with a note saying which are still being stopped.
        Interrupts end in RunInterrupted."""
        error: BaseException | None = None
        try:
            self.launcher.start(self.hub, rank_env(self.options, self.hub))
            value = self.stopper.supervise(self._watch)
        except KeyboardInterrupt:
            with interrupts_deferred():  # another, while the ranks' stacks are asked, must not skip the stop
                error = self._interrupted()
        except BaseException as err:  # noqa: BLE001 - raised again below, after the stop
            error = err
        self._finish(error)
        if error is not None:
            raise error
        return value

    def _finish(self, error: BaseException | None) -> None:
        """Stop the launcher, say what it could not stop (on ``error``), the last messages; close."""
        with interrupts_deferred():  # pressing stop again must not cut the clean-up short
            failed = error if isinstance(error, RunError) and error.failure is not None else None
            dead = {d.rank for d in self.launcher.deaths()} - set(self.record.exited) if failed else set()
            leftovers = self.launcher.stop()  # (after it, every rank it stopped is a death too)
            self._pump(wait=0)
            self.files.close()
            if leftovers:
                note = f"still being stopped after the run: {'; '.join(leftovers)}"
                self.view.notice(f"hvd_magic: {note}") if error is None else error.add_note(note)
            if failed is not None:  # the class, in the record too
                self.view.notice(f"hvd_magic: {diagnosis.failure_line(failed)}")
            for rank in sorted(dead):  # dead without a word: failed, not running
                self._own(Message(Exit(-1), rank), self.clock())
            self.view.close()
            if self.live_timeline is not None:
                self.live_timeline.close()
            if not self.keeps_hub:
                self.hub.close()

    def _interrupted(self) -> RunInterrupted:
        quiet = self.record.stall is not None or self.clock() - self.record.last_message > QUIET_SECONDS
        return RunInterrupted(
            f"interrupted: the {self.options.ranks} ranks were stopped. The notebook's state is unchanged."
            + timeouts.stall_sentence(self.record, self.clock())
            + (self._where("when interrupted") if quiet else "")
        )

    def _where(self, when: str) -> str:
        started, pids = self.record.started, self.record.pids
        return where_each_rank(self.hub, self.options.ranks, started, pids, self.launcher.native_stacks, when)

    def _watch(self) -> Any:
        while True:  # once every rank said its exit, the launcher's end is looked for 10x as often
            self._pump(wait=self.wait / 10 if self.record.all_exited() else self.wait)
            self._beat()
            self.view.tick()
            if self.live_timeline is not None and self.live_timeline.tick():
                self._pump(wait=0)  # what came in while it refreshed, before the time checks
            self._watch_waits()
            self._watch_stragglers()
            if self.record.stall is not None and self.record.stall.since != self.stall_shown:
                self.stall_shown = self.record.stall.since  # once for each stall, where each rank is
                self.view.notice("hvd_magic: the run stalled." + self._where("at the stall"))
            if self.record.errors:
                raise self._rank_failed()  # decided before the stop
            code = self.launcher.poll()
            if code is not None:
                self._drain()
                return self._outcome(code)
            self._check_time_limits()

    def _beat(self) -> None:
        now = self.clock()
        if self.beats and now - self.last_beat >= BEAT_SECONDS:
            self.last_beat = now
            self.hub.tell_all(Beat())  # each rank answers with a RankStatus: its CPU, memory, GPU

    def _watch_waits(self) -> None:
        """torch.distributed ranks: a stall seen in their waits is told like Horovod's; ranks that
        finished while the others wait for them end the run (torch would wait 30 minutes)."""
        seen = self.record.stall
        if not self.record.waits and (seen is None or not seen.own):
            return
        now = self.clock()
        stall = stalls.waiting_stall(self.record.waits, self.record.ranks, now, self.stall_seconds)
        current = seen.stall if seen is not None else None
        if stall is None:
            if seen is not None and seen.own:
                self.record.stall = None  # the waits ended
            return
        if stall != current:
            self._own(Message(stall), now)
        if all(rank in self.record.exited for rank in stall.ranks):
            raise timeouts.left_waiting(self.record, now)

    def _watch_stragglers(self) -> None:
        now = self.clock()
        for straggler in self.stragglers.check(now):  # named once, and when it recovers
            self._own(Message(straggler, straggler.slow_rank), now)

    def _own(self, message: Message, now: float) -> None:
        """A message of the run's own making (a stall in torch ranks' waits, a straggler)."""
        self.record.apply(message, now)
        self.view.message(message)
        self.sinks.message(message)

    def _check_time_limits(self) -> None:
        now = self.clock()
        if self.record.never_started() and now - self.record.began > self.start_limit:
            raise timeouts.start_timeout(self.record, self.start_limit)
        self.stopper.check(now, self.launcher.preempted)
        if self.grow is not None and self.record.result is None and not self.record.exited and self.grow():
            raise SlotsBack()  # (never once a rank ended: a run done is not run again to grow)
        timeout = self.options.timeout  # a hang's limit: it counts once a rank started (a
        # launch slower than ``timeout=``, on a busy cluster, is the start limit's to judge)
        if timeout and self.record.started and now - self.record.last_message > timeout:
            raise timeouts.silence_timeout(self.record, timeout, now, self._where("at the timeout"))

    def _pump(self, wait: float) -> None:
        """Apply the waiting messages, up to a batch, so the view gets its ticks under any load."""
        events = self.hub.events
        for count in range(PUMP_BATCH):
            try:
                message = events.get(timeout=wait) if wait and not count else events.get_nowait()
            except queue.Empty:
                return
            if self.prompts.take(message):  # asked at the notebook: a person's time is no silence
                self.record.last_message = self.clock()
                continue
            now = self.clock()
            self.record.apply(message, now)
            self.stragglers.take(message, now)
            self.files.take(message)
            self.view.message(message)
            self.sinks.message(message)

    def _drain(self) -> None:
        """After the launcher exits: the messages still on their way, until every started rank
        said it exited or is known dead (a killed rank says nothing), or ``DRAIN_SECONDS``; a rank
        dead without a word adds up to ``SETTLE_SECONDS``, for what it sent just before it died."""
        now, launcher = self.clock(), self.launcher
        settle, deadline = now + SETTLE_SECONDS, now + DRAIN_SECONDS
        self._pump(wait=0)
        while self.record.unfinished() and self.clock() < deadline:  # (deaths() may ask Spark)
            waiting, silent = diagnosis.unaccounted(self.record, launcher.deaths(), launcher.ended_by)
            if not waiting and (not silent or self.clock() >= settle):
                break
            self._pump(wait=self.wait / 2)
        self._pump(wait=0)

    def _rank_failed(self) -> RunError:
        """A rank's error that only says Horovod shut down has its cause elsewhere: another rank's
        error on its way, a rank that died without a word (killed, OOM), the run stopped from
        outside (a Spark cancel). Waits briefly for one before anything is stopped, then says which."""
        deadline, launcher = self.clock() + CAUSE_GRACE, self.launcher
        while not diagnosis.explained(self.record, launcher.deaths(), launcher.ended_by):
            if self.clock() >= deadline:
                break
            self._pump(wait=self.wait / 2)
        death = diagnosis.silent_death(self.record, launcher.deaths())
        return diagnosis.rank_failed(self.record, death, launcher.ended_by, launcher.said())

    def _outcome(self, code: int) -> Any:
        if not diagnosis.clean_end(self.record, code):  # else the launcher need not be asked
            said = self.launcher.deaths(), self.launcher.diagnostics(), self.launcher.ended_by
            failure = diagnosis.failure_after_exit(self.record, code, *said)
            if failure is not None:
                raise failure
        assert self.record.result is not None
        try:
            return cloudpickle.loads(self.record.result)
        except Exception as err:  # noqa: BLE001 - whatever the value's class does when unpickled
            raise diagnosis.unloadable_value(err) from None
