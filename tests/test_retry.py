"""Long runs that survive: checkpoints kept whole in the notebook, retries=N after a lost rank
(real ranks killed with SIGKILL), never after the user's own exception, and a first interrupt
that stops at a step boundary and returns the model."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from hvd_magic import FailureClass, RankFailedError, RunError, RunInterrupted
from hvd_magic.protocol import FileChunk, KeptAnswer, KeptRequest, Message, ResumeRequest
from hvd_magic.protocol.files import checkpoint_name
from hvd_magic.run.checkpoint_store import CheckpointStore
from hvd_magic.run.rank_files import RankFiles
from hvd_magic.run.record import RunRecord

from .helpers import leftover_processes, stopped_by_a_notice, when_started

STEPS = 40


def training(marks: Path, fault: str = "", every_attempt: bool = False) -> str:
    """A cell that adds 2 (1 from each rank) to w per step, checkpointing every 5 steps and
    resuming from the latest; at step 22, rank 1 has ``fault`` (once, unless ``every_attempt``)."""
    once = "" if every_attempt else f" and not pathlib.Path({str(marks)!r}, 'hit').exists()"
    return f"""
import os, pathlib, signal, horovod.torch as hvd, torch, hvd_magic
hvd.init()
state = hvd_magic.resume() or {{"step": 0, "w": torch.zeros(1)}}
w = state["w"]
pathlib.Path({str(marks)!r}, f"resumed-{{hvd.rank()}}-{{state['step']}}").touch()
for step in range(state["step"], {STEPS}):
    w = w + hvd.allreduce(torch.ones(1), op=hvd.Sum)
    if step % 5 == 4:
        hvd_magic.checkpoint({{"step": step + 1, "w": w}}, step=step + 1)
    hvd_magic.report(step=step + 1, total={STEPS})
    if step == 22 and hvd.rank() == 1{once}:
        pathlib.Path({str(marks)!r}, "hit").touch()
        {fault}
w.item()
"""


KILL = "os.kill(os.getpid(), signal.SIGKILL)"


def test_a_killed_rank_is_retried_from_the_last_checkpoint_and_ends_as_if_never_killed(ip, tmp_path, capsys):
    store = tmp_path / "checkpoints"
    cell = training(tmp_path, KILL)
    value = ip.run_cell_magic("horovod", f"np=-2 launcher=gloo retries=2 checkpoint_dir={store}", cell)
    assert value == 2.0 * STEPS  # the same as a run that was not killed
    assert (tmp_path / "resumed-0-0").exists() and (tmp_path / "resumed-1-20").exists()  # from step 20
    shown = capsys.readouterr().err
    assert "killed from outside: rank 1 on " in shown and "killed by signal 9" in shown
    assert "attempt 2 of 3 from step 20" in shown
    assert "finished on attempt 2 of 3" in shown
    assert sorted(os.listdir(store)) == [checkpoint_name(step) for step in (30, 35, 40)]  # the last 3


def test_the_users_exception_is_not_retried(ip, tmp_path, capsys):
    cell = training(tmp_path, "raise ValueError('bad row')")
    with pytest.raises(RankFailedError, match="ValueError: bad row") as info:
        ip.run_cell_magic("horovod", "np=-2 launcher=gloo retries=2", cell)
    assert "attempt 2" not in capsys.readouterr().err
    assert info.value.failure is FailureClass.CODE
    assert "not retried (the cell's code raised): the cell's own exception would be raised again" in (
        info.value.__notes__
    )
    assert not (tmp_path / "resumed-0-20").exists()


def test_retries_exhausted_name_each_attempts_cause(ip, tmp_path):
    cell = training(tmp_path, KILL, every_attempt=True)
    with pytest.raises(RunError) as info:
        ip.run_cell_magic("horovod", "np=-2 launcher=gloo retries=1", cell)
    (attempts,) = [note for note in info.value.__notes__ if note.startswith("attempts: ")]
    assert attempts.count("killed from outside: rank 1 on ") == 2 and "1. " in attempts and "2. " in attempts
    assert leftover_processes() == []


STOPPABLE = """
import pathlib, time, horovod.torch as hvd, torch, hvd_magic
hvd.init()
w = torch.zeros(1)
pathlib.Path({marks!r}, f"started-{{hvd.rank()}}").touch()
step = 0
while True:
    step += 1
    w = w + hvd.allreduce(torch.ones(1), op=hvd.Sum)
    if hvd_magic.stopping():
        hvd_magic.checkpoint({{"step": step, "w": w}}, step=step)
        break
    if step == 1:  # past its first boundary, not stopping
        pathlib.Path({marks!r}, f"polled-{{hvd.rank()}}").touch()
    time.sleep({pause})
(step, w.item())
"""


def recorded_stops(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every run's GracefulStop, as it is made."""
    from hvd_magic.run import graceful

    stops: list[graceful.GracefulStop] = []
    real_init = graceful.GracefulStop.__init__

    def recorded(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        stops.append(self)

    monkeypatch.setattr(graceful.GracefulStop, "__init__", recorded)
    return stops


def wait_until(test, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not test() and time.monotonic() < deadline:
        time.sleep(0.02)


def press_once_polling(stops: list) -> None:
    """The stop button, once the notebook heard that the ranks poll hvd_magic.stopping()."""
    wait_until(lambda: bool(stops) and stops[-1].polls)
    os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("given", [True, False])
def test_a_first_interrupt_stops_at_a_step_boundary_and_returns_the_model(
    ip, tmp_path, capsys, monkeypatch, given
):
    """The final checkpoint is where the run says, in the run's checkpoint_dir= or, without one,
    in the temporary folder it names (kept: it was removed as the cell returned)."""
    store = tmp_path / "checkpoints"
    stops = recorded_stops(monkeypatch)
    when_started(tmp_path, 2, lambda: press_once_polling(stops))
    line = f"np=-2 checkpoint_dir={store}" if given else "np=-2"
    step, total = ip.run_cell_magic("horovod", line, STOPPABLE.format(marks=str(tmp_path), pause=0.01))
    assert total == 2.0 * step  # every rank left the loop at the same step
    shown = capsys.readouterr().err
    assert "stopping at the next step boundary" in shown and f"stopped on request at step {step:,}" in shown
    named = Path(shown.split("its checkpoint is in ", 1)[1].split()[0])
    assert named == store or not given
    assert os.listdir(named) == [checkpoint_name(step)]  # the final checkpoint
    if not given:
        shutil.rmtree(named)


def press_once_past_the_first_boundary(stops: list, marks: Path) -> None:
    """The stop button once both ranks passed their first step boundary without stopping: the
    next is a whole step away. (Pressed as soon as the first rank polled, a stop could land
    while that boundary was still being agreed on, under load, and end the run there.)"""
    wait_until(lambda: all((marks / f"polled-{rank}").exists() for rank in (0, 1)))
    press_once_polling(stops)


def test_ranks_that_do_not_reach_a_boundary_in_time_are_stopped_at_once(ip, tmp_path, monkeypatch):
    stops = recorded_stops(monkeypatch)
    when_started(tmp_path, 2, lambda: press_once_past_the_first_boundary(stops, tmp_path))
    started = time.monotonic()
    with pytest.raises(RunInterrupted):  # a step takes 60 s here: past the 5 s grace
        ip.run_cell_magic("horovod", "np=-2", STOPPABLE.format(marks=str(tmp_path), pause=60))
    assert time.monotonic() - started < 60
    assert leftover_processes() == []


def test_a_second_interrupt_stops_at_once(ip, tmp_path, monkeypatch):
    from hvd_magic.run import graceful

    monkeypatch.setattr(graceful, "GRACE_SECONDS", 600.0)  # only the second interrupt can end it in time
    stops = recorded_stops(monkeypatch)

    def press_twice() -> None:
        press_once_past_the_first_boundary(stops, tmp_path)
        wait_until(lambda: stops[-1].asked_at is not None)  # the first press asked the ranks to stop
        os.kill(os.getpid(), signal.SIGINT)

    when_started(tmp_path, 2, press_twice)
    started = time.monotonic()
    with pytest.raises(RunInterrupted):
        ip.run_cell_magic("horovod", "np=-2", STOPPABLE.format(marks=str(tmp_path), pause=600))
    assert time.monotonic() - started < 120
    assert stops[-1].asked_at is not None  # the first press took the graceful path
    assert leftover_processes() == []


WAITED_CHECKPOINT = """
import os, pathlib, signal, horovod.torch as hvd, torch, hvd_magic
hvd.init()
state = hvd_magic.resume()
if state is None:
    big = torch.ones(16 * 2**20 // 4)  # 16 MiB: four chunks, not all sent when it was asked for
    kept = hvd_magic.checkpoint({{"step": 7, "big": big}}, step=7, wait=True)
    if hvd.rank() == 0:
        pathlib.Path({marks!r}, f"kept-{{kept}}").touch()
        os.kill(os.getpid(), signal.SIGKILL)  # the moment it returned
    hvd.allreduce(torch.ones(1))  # rank 1 waits here for rank 0, which is gone
(state["step"], float(state["big"].sum()))
"""


def test_a_checkpoint_waited_for_is_kept_though_its_rank_is_killed_the_moment_it_returns(ip, tmp_path):
    value = ip.run_cell_magic(
        "horovod", "np=-2 launcher=gloo retries=1", WAITED_CHECKPOINT.format(marks=str(tmp_path))
    )
    assert (tmp_path / "kept-True").exists()
    assert value == (7, 4.0 * 2**20)  # the second attempt resumed from it


def test_a_clouds_notice_read_on_the_ranks_machine_checkpoints_where_they_are(ip, tmp_path, capsys):
    """HVD_MAGIC_PREEMPTION=file:PATH (what aws, gcp and azure read from their metadata service):
    the ranks see the notice appear, checkpoint at their next stopping() and the run starts again
    from that step, every step counted once."""
    notice = tmp_path / "spot-notice"
    when_started(tmp_path, 2, lambda: notice.write_text("reclaimed in 2 minutes\n"))
    line = f"np=-2 launcher=gloo retries=1 env=HVD_MAGIC_PREEMPTION=file:{notice}"
    stays = f"os.unlink({str(notice)!r})  # in this test, the machine stays"
    total, starts = ip.run_cell_magic("horovod", line, stopped_by_a_notice(tmp_path, then=stays))
    assert len(starts) == 2 and starts[0] == 0 and 0 < starts[1] < 3000, starts
    assert total == starts[1] + 20
    said = capsys.readouterr().err
    assert (
        "preemption notice: rank " in said
        and ": reclaimed in 2 minutes: the ranks write a checkpoint" in said
    )
    assert f"attempt 2 of 2 from step {starts[1]}" in said
    named = said.split("its checkpoint is in ", 1)[1].split()[0].rstrip(":;,")
    assert named.startswith(tempfile.gettempdir()) and not os.path.exists(named)  # the retry went on from it


ENDS_AFTER_A_NOTICE = """
import pathlib, time, horovod.torch as hvd, hvd_magic
hvd.init()
hvd_magic.stopping()  # the ranks poll: a notice asks them to stop at their next call
pathlib.Path({marks!r}, f"started-{{hvd.rank()}}").touch()
for _ in range(1200):  # their last step, until the notebook took the notice; no call after it
    if pathlib.Path({marks!r}, "go").exists():
        break
    time.sleep(0.1)
"the end"
"""


def test_a_run_that_ends_before_its_ranks_stop_for_a_notice_returns_its_value(
    ip, tmp_path, capsys, monkeypatch
):
    """The notice came during the cell's last step, and the ranks ended without calling
    stopping() again: the run is done, not preempted (its value was dropped for a RunError)."""
    notice, stops = tmp_path / "spot-notice", recorded_stops(monkeypatch)

    def notice_then_go() -> None:
        notice.write_text("reclaimed in 2 minutes\n")
        wait_until(lambda: stops[-1].preempted is not None, 120)
        (tmp_path / "go").touch()

    when_started(tmp_path, 2, notice_then_go)
    line = f"np=-2 launcher=gloo env=HVD_MAGIC_PREEMPTION=file:{notice}"
    assert ip.run_cell_magic("horovod", line, ENDS_AFTER_A_NOTICE.format(marks=str(tmp_path))) == "the end"
    said = capsys.readouterr().err
    assert ": reclaimed in 2 minutes: the run ended before its ranks stopped" in said


def test_a_preemption_source_that_means_nothing_is_refused_before_launch(ip):
    with pytest.raises(UsageError, match="HVD_MAGIC_PREEMPTION=oracle: say where each rank looks"):
        ip.run_cell_magic("horovod", "np=-2 env=HVD_MAGIC_PREEMPTION=oracle", "1")


def test_a_kept_question_is_answered_after_the_chunks_before_it(tmp_path):
    answers: list[tuple[bytes, object]] = []
    files = RankFiles(
        None, None, CheckpointStore(str(tmp_path)), lambda to, record: answers.append((to, record))
    )
    files.take(Message(KeptRequest(1, step=5), rank=0, identity=b"r0"))
    files.take(Message(FileChunk(checkpoint_name(5), last=False), rank=0, blob=b"half"))
    files.take(Message(KeptRequest(2, step=5), rank=0, identity=b"r0"))
    files.take(Message(FileChunk(checkpoint_name(5), last=True), rank=0, blob=b"whole"))
    files.take(Message(KeptRequest(3, step=5), rank=0, identity=b"r0"))
    assert answers == [(b"r0", KeptAnswer(1)), (b"r0", KeptAnswer(2)), (b"r0", KeptAnswer(3, kept=True))]
    assert (tmp_path / checkpoint_name(5)).read_bytes() == b"halfwhole"


def test_a_torn_checkpoint_is_never_the_latest(tmp_path):
    store = CheckpointStore(str(tmp_path))
    (tmp_path / checkpoint_name(10)).write_bytes(b"whole")
    (tmp_path / f"{checkpoint_name(20)}.partial").write_bytes(b"torn by a kill")
    answer, blob = store.answer(Message(ResumeRequest(3), rank=1))
    assert (answer.found, answer.step, blob) == (True, 10, b"whole")
    assert store.steps() == [10]


def test_a_checkpoint_pruned_meanwhile_gives_the_next_and_one_unreadable_an_answer_that_says_why(tmp_path):
    """Another run sharing the folder pruned the highest between the listing and the read: the
    next highest is the latest. One that cannot be read is an answer with the error, not an
    exception on the hub's thread; a prune that finds the file gone goes on."""
    store = CheckpointStore(str(tmp_path))
    (tmp_path / checkpoint_name(10)).write_bytes(b"ten")
    (tmp_path / checkpoint_name(20)).write_bytes(b"twenty")
    listed = store.steps()
    (tmp_path / checkpoint_name(20)).unlink()  # pruned by the other run
    store.steps = lambda: listed  # type: ignore[method-assign]  # the listing taken before it
    assert store.latest() == (10, b"ten")
    store = CheckpointStore(str(tmp_path))
    (tmp_path / checkpoint_name(30)).mkdir()  # not a file a checkpoint can be read from
    answer, blob = store.answer(Message(ResumeRequest(4), rank=1))
    assert (answer.found, blob) == (False, b"") and "IsADirectoryError" in answer.error
    for step in (40, 50, 60):
        (tmp_path / checkpoint_name(step)).write_bytes(b"x")
    (tmp_path / checkpoint_name(30)).rmdir()
    store.steps = lambda: [10, 30, 40, 50, 60]  # type: ignore[method-assign]  # 30 gone meanwhile
    store.landed(str(tmp_path / checkpoint_name(60)))  # prunes 10, then 30: already gone
    assert not (tmp_path / checkpoint_name(10)).exists()


def test_a_checkpoint_store_that_cannot_be_read_is_named_in_the_ranks_error(ip, tmp_path):
    """resume() on the ranks raises ``CheckpointError`` with the notebook's reason, at once (it
    waited 5 minutes: the hub's thread had ended on it)."""
    (tmp_path / checkpoint_name(7)).mkdir()
    cell = "import hvd_magic\nhvd_magic.resume()"
    with pytest.raises(RunError, match="CheckpointError: resume\\(\\): the notebook could not read"):
        ip.run_cell_magic("horovod", f"np=-2 launcher=gloo checkpoint_dir={tmp_path} timeout=120", cell)


def test_a_negative_step_is_refused_where_it_is_given():
    """checkpoint(step=-1) was written under a name the store never lists: never resumed, never pruned."""
    from hvd_magic import CheckpointError, checkpoint

    with pytest.raises(CheckpointError, match=r"checkpoint\(step=-1\): a step is 0 or more"):
        checkpoint({}, step=-1)


def test_an_attempts_ranks_share_one_read_of_the_latest_until_another_lands(tmp_path):
    """Each rank's resume() read the checkpoint anew: np copies of it in the kernel at once."""
    store = CheckpointStore(str(tmp_path))
    (tmp_path / checkpoint_name(10)).write_bytes(b"ten" * 1000)
    blobs = [store.answer(Message(ResumeRequest(rank), rank=rank))[1] for rank in range(4)]
    assert blobs[0] == b"ten" * 1000 and all(blob is blobs[0] for blob in blobs)
    (tmp_path / checkpoint_name(10)).write_bytes(b"ten again")  # a resumed attempt writes step 10 anew
    store.landed(str(tmp_path / checkpoint_name(10)))
    answer, blob = store.answer(Message(ResumeRequest(5), rank=0))
    assert (answer.step, blob) == (10, b"ten again")


def test_checkpoints_go_to_an_fsspec_url_whole(tmp_path):
    store = CheckpointStore("memory://hvd-magic-test/run")
    for step in (5, 10, 15, 20):
        path = Path(store.folder) / checkpoint_name(step)
        path.write_bytes(str(step).encode())
        store.landed(str(path))
    assert store.steps() == [10, 15, 20]  # the last 3
    assert store.latest() == (20, b"20")
    staging = store.folder
    store.discard()
    assert not os.path.exists(staging) and store.steps() == [10, 15, 20]  # the URL's copies stay


def test_each_failure_class_and_whether_it_is_retried():
    """The diagnosis decides each failure's class and words once (``RunError.failure``,
    ``.cause``); the retry policy reads them from the error."""
    from hvd_magic.launch import RankDeath
    from hvd_magic.protocol import Exit, RankError, Started
    from hvd_magic.run.diagnosis import failure_after_exit

    def ended(deaths: list[RankDeath]) -> tuple[FailureClass | None, str]:
        error = failure_after_exit(record, 1, deaths, "")
        assert error is not None
        return error.failure, error.cause

    record = RunRecord(2)
    record.apply(Message(Started("hostB", 1, 0, 2), 1), 0.0)
    killed = RankDeath(1, "was killed by signal 9 (SIGKILL)", failure=FailureClass.KILLED)
    assert ended([killed]) == (FailureClass.KILLED, "rank 1 on hostB was killed by signal 9 (SIGKILL)")
    for failure, retried in [
        (FailureClass.KILLED, True),
        (FailureClass.LOST, True),
        (FailureClass.OOM, False),
        (FailureClass.CRASH, False),
        (FailureClass.EXIT, False),
        (FailureClass.CANCELLED, False),
    ]:
        assert ended([RankDeath(1, "ended", failure=failure)])[0] is failure and failure.retried is retried
        assert bool(failure.why_not_retried) is not retried  # each class not retried says why
    assert ended([]) == (FailureClass.LOST, "rank 1 on hostB ended without a word")
    record.apply(Message(RankError("hostB", "ValueError", "bad"), 1), 0.0)
    record.apply(Message(Exit(1), 1), 0.0)
    assert ended([RankDeath(1, "exited with code 1")]) == (FailureClass.CODE, "rank 1 raised ValueError")
    assert not FailureClass.CODE.retried


def test_an_interrupt_while_a_retry_waits_for_its_slots_says_which_attempt_it_stopped(tmp_path):
    """It said "nothing was launched" after attempts had run."""
    from hvd_magic.options import make_options
    from hvd_magic.run.retry import Attempts

    from .helpers import RecordingView

    attempts = Attempts(
        make_options(np=-2, retries=2), RecordingView(), CheckpointStore(None), lambda o: None
    )
    assert "nothing was launched" in str(attempts.interrupted())
    lost = RunError("rank 1 on hostB was lost")
    lost.failure, lost.cause = FailureClass.LOST, "rank 1 on hostB was lost"
    attempts.failed(lost)

    def interrupted_while_waiting(options: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        attempts.launcher(interrupted_while_waiting, 0)
    said = str(attempts.interrupted())
    assert said.startswith("interrupted while attempt 2 waited for its slots; it was not launched")
    assert "1. executor or host lost: rank 1 on hostB was lost" in said and "nothing was launched" not in said


PROGRESS = """
import pathlib, time, horovod.torch as hvd, torch, hvd_magic
hvd.init()
seen = 0
for epoch in range(1000):
    for batch in hvd_magic.progress(range(50), epoch=epoch, epochs=1000, stoppable=True):
        hvd.allreduce(torch.ones(1))
        seen += 1
        pathlib.Path({marks!r}, f"started-{{hvd.rank()}}").touch()
        time.sleep(0.005)
(seen, hvd.allreduce(torch.tensor([float(seen)]), op=hvd.Min).item())
"""

KERAS = """
import pathlib, numpy as np, tensorflow as tf, horovod.tensorflow.keras as hvd, hvd_magic
hvd.init()
net = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
net.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
class Mark(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pathlib.Path({marks!r}, f"started-{{hvd.rank()}}").touch()
history = net.fit(np.random.rand(64, 4), np.random.rand(64, 1), batch_size=8, epochs=10_000, verbose=0,
                  callbacks=[hvd_magic.LiveCallback(stoppable=True), Mark()])
len(history.history["loss"])
"""


@pytest.mark.parametrize("loop", ["progress", "keras"])
def test_the_helpers_stop_at_a_step_boundary_when_asked(ip, tmp_path, monkeypatch, capsys, loop):
    stops = recorded_stops(monkeypatch)
    when_started(tmp_path, 2, lambda: press_once_polling(stops))
    cell = (PROGRESS if loop == "progress" else KERAS).format(marks=str(tmp_path))
    value = ip.run_cell_magic("horovod", "np=-2", cell)
    if loop == "progress":
        seen, fewest = value
        assert seen == fewest > 0  # every rank left at the same step
    else:
        assert 0 < value < 10_000  # fit ended early, on every rank (else the cell would hang)
    assert "stopped on request" in capsys.readouterr().err
