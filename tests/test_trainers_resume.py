"""``retries=`` resumes the trainers through their own checkpoints (issue 79): a rank SIGKILLed
mid-epoch, and the retried attempt's ``train()`` / ``fit()``, called as before, resumes from the
latest checkpoint the trainer wrote (kept by the run: on Spark the disk it was written to may be
gone) and ends with the weights of a run never killed. A preemption notice stops a trainer
through its own flag at one step on every rank, where it writes its checkpoint, and the retry
resumes from there. Nothing of hvd_magic's in the cells; a kill in the cell's own callback and
a file that appears stand for the lost executor and the cloud's notice."""

from __future__ import annotations

import math
import os
import types
from pathlib import Path

import cloudpickle
import pytest

from hvd_magic import launch
from hvd_magic.run.checkpoint_store import CheckpointStore

from .helpers import when_started
from .test_retry import recorded_stops, wait_until
from .test_trainers import TINY_BERT

pytestmark = pytest.mark.timeout(400)

# How a cell's first attempt ends, at a step its trainer just ended (``at``): rank 1 killed, once
# (the ``killed`` folder says whether it was); or the ranks wait there, marked started, until the
# test says ``go`` (once the notebook took a preemption notice). The trainers ask whether to stop
# every step but read the ranks' answer some 50 ms of steps later (StoppingLate): with this tiny
# model's 7 ms steps a stop could land after the run's last step, so steps take 50 ms there, and
# the ranks go on only once each has the stop
KILL = """
def step_ended(rank, step):
    if rank == 1 and step == {at} and not os.listdir({marks!r} + "/killed"):
        pathlib.Path({marks!r}, "killed", "once").touch()
        os.kill(os.getpid(), 9)
"""
NOTICE = """
def step_ended(rank, step):
    import time
    from hvd_magic.rank import inbox
    time.sleep(0.05)  # steps as long as a real model's: the ranks agree on a stop within a step or two
    go = pathlib.Path({marks!r}, "go")
    if step == {at} and not go.exists():
        pathlib.Path({marks!r}, f"started-{{rank}}").touch()
        for _ in range(1200):
            if go.exists():
                break
            time.sleep(0.1)
        inbox.current().stop_asked.wait(120)  # until this rank has the stop, however loaded the machine
"""
NEVER = "\ndef step_ended(rank, step):\n    pass\n"

# 16 steps, a checkpoint every 4. Each rank marks where its training began and ended, and each
# checkpoint-N it wrote
HF = (
    TINY_BERT
    + """
{end}
class Marks(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        began = f"began-{{args.process_index}}-{{state.global_step}}-{{args.world_size}}"
        pathlib.Path({marks!r}, began).touch()
    def on_step_end(self, args, state, control, **kwargs):
        step_ended(args.process_index, state.global_step)
    def on_save(self, args, state, control, **kwargs):
        if os.path.isdir(os.path.join(args.output_dir, f"checkpoint-{{state.global_step}}")):
            pathlib.Path({marks!r}, f"saved-{{args.process_index}}-{{state.global_step}}").touch()
    def on_train_end(self, args, state, control, **kwargs):
        pathlib.Path({marks!r}, f"ended-{{args.process_index}}-{{state.global_step}}").touch()
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=16, num_train_epochs=2,
                         report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="steps", save_steps=4)
model = BertForSequenceClassification(config)
trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Marks()])
trainer.train()
(trainer.state.global_step, sum(float(p.double().sum()) for p in trainer.model.parameters()))
"""
)

# 3 epochs of 8 steps; Lightning's own ModelCheckpoint writes one at each epoch's end
LIGHTNING = """
import os, pathlib, tempfile, torch, lightning
torch.manual_seed(0)
x = torch.randn(256, 8)
y = x.sum(1, keepdim=True)
{end}
class Net(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)
    def on_save_checkpoint(self, checkpoint):  # the module's own part, added after the callbacks'
        checkpoint["steps_seen"] = self.trainer.global_step
    def on_load_checkpoint(self, checkpoint):
        assert checkpoint["steps_seen"] == checkpoint["global_step"], "the module's own part is missing"
class Marks(lightning.Callback):
    def on_train_start(self, trainer, module):
        began = f"began-{{trainer.global_rank}}-{{trainer.global_step}}-{{trainer.world_size}}"
        pathlib.Path({marks!r}, began).touch()
    def on_train_batch_end(self, trainer, module, outputs, batch, index):
        step_ended(trainer.global_rank, trainer.global_step)
    def on_train_end(self, trainer, module):
        pathlib.Path({marks!r}, f"ended-{{trainer.global_rank}}-{{trainer.global_step}}").touch()
trainer = lightning.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=3, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=[Marks()],
                            default_root_dir=tempfile.mkdtemp())
net = Net()
data = torch.utils.data.TensorDataset(x, y)
trainer.fit(net, torch.utils.data.DataLoader(data, batch_size=16, shuffle=True))
(trainer.global_step, sum(float(p.double().sum()) for p in net.parameters()))
"""

# An Accelerate loop as its docs write one, resuming from its own save_state folder when there
# is one: 3 epochs of 8 steps, a save every 4, and a save where ``check_trigger()`` says to stop
# (Accelerate's way to stop every process at one step). Rank 1 dies at step 10 of the first
# attempt, and takes the folder with it (as a lost executor's disk would): the run's copy is
# restored.
ACCELERATE = """
import os, pathlib, shutil, tempfile, torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
# a seedable sampler: each epoch's order from the seed and the epoch, as Accelerate advises for resuming
accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
set_seed(0)
x = torch.randn(256, 8)
y = x.sum(1, keepdim=True)
class Progress:
    step = 0
    def state_dict(self):
        return {{"step": self.step}}
    def load_state_dict(self, state):
        self.step = state["step"]
progress = Progress()
accelerator.register_for_checkpointing(progress)
data = torch.utils.data.TensorDataset(x, y)
model = torch.nn.Linear(8, 1)
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05), loader)
saved = os.path.join({marks!r}, "saved")
if os.path.isdir(saved):
    accelerator.load_state(saved)
rank = accelerator.process_index
pathlib.Path({marks!r}, f"began-{{rank}}-{{progress.step}}-{{accelerator.num_processes}}").touch()
{end}
stopped = False
while progress.step < 24 and not stopped:
    epoch, done_here = divmod(progress.step, len(loader))
    loader.set_epoch(epoch)
    for xb, yb in accelerator.skip_first_batches(loader, done_here) if done_here else loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        progress.step += 1
        if progress.step % 4 == 0:
            accelerator.save_state(saved)
        if {kill} and rank == 1 and progress.step == 10 and not os.listdir({marks!r} + "/killed"):
            pathlib.Path({marks!r}, "killed", "once").touch()
            shutil.rmtree(saved)
            os.kill(os.getpid(), 9)
        step_ended(rank, progress.step)
        if accelerator.check_trigger():
            accelerator.save_state(saved)
            stopped = True
            break
pathlib.Path({marks!r}, f"ended-{{rank}}-{{progress.step}}").touch()
(progress.step, sum(float(p.double().sum()) for p in model.parameters()))
"""


# Each trainer: its cell, the steps of a whole run, the step rank 1 is killed at and the
# checkpoints before it
TRAINERS = {
    "hf": (HF, 16, 10, {4, 8}),
    "lightning": (LIGHTNING, 24, 12, {8}),
    "accelerate": (ACCELERATE, 24, 10, {4, 8}),
    # Lightning's auto-resume idiom: ckpt_path="last" finds nothing on the retry's new disk
    "lightning-last": (LIGHTNING.replace("shuffle=True))", 'shuffle=True), ckpt_path="last")'), 24, 12, {8}),
}
# Where a run's ranks wait until the notebook took the notice, and where the retry resumes after
# a stop at step N: HF from its checkpoint-N; Lightning from the end of the epoch before (8 steps
# an epoch; the checkpoint Lightning writes at a stop mid-epoch marks the epoch as ended);
# Accelerate from the state the loop saved where it stopped
NOTICED_AT = {"hf": 6, "lightning": 12, "accelerate": 6}
RESUMED_AT = {"hf": lambda at: at, "lightning": lambda at: at // 8 * 8, "accelerate": lambda at: at}
_never_stopped: dict[str, tuple[int, float]] = {}


def cell(trainer: str, marks: Path, end: str = NEVER, at: int = 0) -> str:
    (marks / "killed").mkdir(parents=True, exist_ok=True)
    hook = end.format(marks=str(marks), at=at)
    return TRAINERS[trainer][0].format(marks=str(marks), end=hook, kill=end is KILL)


def never_stopped(ip, tmp_path: Path, trainer: str) -> tuple[int, float]:
    """The step count and weights of a run of ``trainer``'s cell never stopped (one run a session)."""
    if trainer not in _never_stopped:
        _never_stopped[trainer] = ip.run_cell_magic(
            "horovod", "np=-2 backend=torch", cell(trainer, tmp_path / "never")
        )
    return _never_stopped[trainer]


def marked(marks: Path, what: str) -> set[tuple[int, int]]:
    """(rank, step) of each ``what-RANK-STEP`` mark (a ``began`` mark's world size after)."""
    return {(int(p.name.split("-")[1]), int(p.name.split("-")[2])) for p in marks.glob(f"{what}-*")}


def worlds(marks: Path) -> set[tuple[int, int, int]]:
    """(rank, step, world size) where each rank's training began."""
    return {tuple(int(n) for n in p.name.split("-")[1:]) for p in marks.glob("began-*")}  # type: ignore[misc]


# The checkpoints a run of each cell keeps at its end (the last three the trainer wrote): steps of
# the whole run, however many attempts it took (an attempt's steps go on from those it resumed)
LAST_KEPT = {
    "hf": [8, 12, 16],
    "lightning": [8, 16, 24],
    "lightning-last": [8, 16, 24],
    "accelerate": [16, 20, 24],
}


@pytest.mark.parametrize("trainer", ["hf", "lightning", "lightning-last", "accelerate"])
def test_a_killed_rank_is_resumed_from_the_trainers_own_checkpoint(ip, tmp_path, trainer):
    _, steps, at, kept = TRAINERS[trainer]
    killed, store = tmp_path / "killed", tmp_path / "store"
    step, weights = ip.run_cell_magic(
        "horovod", f"np=-2 backend=torch retries=1 checkpoint_dir={store}", cell(trainer, killed, KILL, at)
    )
    assert CheckpointStore(str(store)).steps() == LAST_KEPT[trainer]
    assert (killed / "killed" / "once").exists()  # the first attempt lost rank 1
    began = {at for rank, at in marked(killed, "began") if rank == 1}
    assert began - {0} and began - {0} <= kept, began  # the second attempt began where a checkpoint was
    expected_step, expected = never_stopped(ip, tmp_path, trainer)
    assert step == expected_step == steps
    assert math.isclose(weights, expected, rel_tol=1e-6, abs_tol=1e-6), (weights, expected)


@pytest.mark.parametrize("trainer", ["hf", "lightning", "accelerate"])
def test_min_np_resumes_a_trainer_on_the_ranks_there_are_as_its_world(
    ip, tmp_path, monkeypatch, capsys, trainer
):
    """``min_np=1``: rank 1 lost, the cluster has one slot left, and the next attempt's trainer
    resumes its checkpoint on one rank, taking that for its world size (Lightning's
    ``devices=2``, written for the run, made this attempt's). The slots are an in-memory count
    here: a Spark host really lost, and the resize it makes, are test_launch_spark_standalone's."""
    monkeypatch.setattr(launch, "slots_now", lambda options: 1)
    _, steps, at, kept = TRAINERS[trainer]
    marks = tmp_path / "smaller"
    line = "np=-2 backend=torch retries=1 min_np=1 resize_wait=0"
    step, _ = ip.run_cell_magic("horovod", line, cell(trainer, marks, KILL, at))
    assert (marks / "killed" / "once").exists()
    first = {(0, 0, 2), (1, 0, 2)}
    assert first < worlds(marks), worlds(marks)
    ((rank, resumed, world),) = worlds(marks) - first
    assert (rank, world) == (0, 1) and resumed in kept, worlds(marks)  # one rank, from a checkpoint
    assert max(at for _, at in marked(marks, "ended")) == step > resumed  # and trained on to its end
    assert "2 → 1 ranks: " in capsys.readouterr().err


@pytest.mark.parametrize("trainer", ["hf", "lightning", "accelerate"])
def test_a_preemption_notice_stops_a_trainer_where_its_retry_resumes(
    ip, tmp_path, capsys, monkeypatch, trainer
):
    """HVD_MAGIC_PREEMPTION=file:PATH: the ranks, waiting at a step, see the notice appear; the
    trainer's own flag stops them at one step, where the trainer writes its checkpoint; the
    retry resumes (``RESUMED_AT``) and ends as a run never stopped."""
    steps = TRAINERS[trainer][1]
    marks, notice = tmp_path / "noticed", tmp_path / "spot-notice"
    stops = recorded_stops(monkeypatch)

    def notice_then_go() -> None:
        notice.write_text("reclaimed in 2 minutes\n")
        wait_until(lambda: stops[-1].preempted is not None, 120)
        notice.unlink()  # in this test, the machine stays: the retry sees no notice
        (marks / "go").touch()

    when_started(marks, 2, notice_then_go)
    line = f"np=-2 backend=torch retries=1 env=HVD_MAGIC_PREEMPTION=file:{notice}"
    step, weights = ip.run_cell_magic("horovod", line, cell(trainer, marks, NOTICE, NOTICED_AT[trainer]))
    first = {(rank, at) for rank, at in marked(marks, "ended") if at < steps}
    stopped = {at for _, at in first}
    assert len(first) == 2 and len(stopped) == 1, first  # both ranks, at one step
    (at_step,) = stopped
    assert NOTICED_AT[trainer] <= at_step < steps, first  # not before the notice
    if trainer == "hf":
        assert {(0, at_step), (1, at_step)} <= marked(marks, "saved")  # the trainer wrote checkpoint-N there
    resumed = RESUMED_AT[trainer](at_step)
    assert marked(marks, "began") == {(0, 0), (1, 0), (0, resumed), (1, resumed)}  # the retry began there
    said = capsys.readouterr().err
    assert "preemption notice: rank " in said and ": reclaimed in 2 minutes: the ranks write" in said
    assert f"attempt 2 of 2 from step {resumed}" in said
    expected_step, expected = never_stopped(ip, tmp_path, trainer)
    assert step == expected_step == steps
    assert math.isclose(weights, expected, rel_tol=1e-6, abs_tol=1e-6), (weights, expected)


def test_only_a_retried_attempt_resumes_and_only_the_training_that_wrote_the_checkpoint(ip, tmp_path):
    """A run's first attempt resumes nothing: here a cell's second HF trainer, which found the
    first's checkpoint-16 the latest the run kept and trained no step. (In a retried attempt,
    each training resumes only what it wrote: the test below.)"""
    marks = tmp_path / "two"
    again = (
        "\ntrainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Rows(),"
    )
    again += " callbacks=[Marks()])\ntrainer.train()\n(trainer.state.global_step, 0.0)\n"
    step, _ = ip.run_cell_magic("horovod", "np=-2 backend=torch retries=1", cell("hf", marks) + again)
    assert step == 16 and marked(marks, "began") == {(0, 0), (1, 0)}  # each training from its start
    assert marked(marks, "ended") == {(0, 16), (1, 16)}


def test_a_retried_attempts_training_takes_only_what_the_same_training_of_the_run_kept(monkeypatch, tmp_path):
    """``resuming.Trainings`` over a real ``CheckpointStore`` (the run's checkpoint() and
    resume() in memory; a new ``Trainings`` for each attempt's new rank process): each kept
    checkpoint is marked with its trainer, the run and which of the cell's trainings wrote it,
    and a training's steps go to the store above those of the trainings before it (the store's
    latest is its highest step). A first attempt resumes nothing; a retried attempt's first
    training nothing the second wrote, nor an earlier run's."""
    from hvd_magic.protocol.env import ENV_ATTEMPT, ENV_KEEP_CHECKPOINTS, ENV_RUN
    from hvd_magic.protocol.files import checkpoint_name
    from hvd_magic.rank.trainers import resuming

    store = CheckpointStore(str(tmp_path / "store"))

    def checkpoint(state: object, step: int) -> bool:
        path = os.path.join(store.folder, checkpoint_name(step))
        with open(path, "wb") as file:
            file.write(cloudpickle.dumps(state))
        store.landed(path)
        return True

    def resume() -> object:
        latest = store.latest()
        return None if latest is None else cloudpickle.loads(latest[1])

    monkeypatch.setenv(ENV_KEEP_CHECKPOINTS, "1")
    monkeypatch.setenv(ENV_RUN, "an earlier run")
    rank = resuming.Trainings(checkpoint, resume)  # an attempt's ranks are new processes
    rank.keep("hf", 4, "earlier", rank.begin("hf"))  # found in checkpoint_dir=
    monkeypatch.setenv(ENV_RUN, "this run")
    monkeypatch.delenv(ENV_ATTEMPT, raising=False)
    rank = resuming.Trainings(checkpoint, resume)
    first = rank.begin("hf")
    assert rank.kept("hf", first) is None  # a first attempt: nothing resumed
    for step in (4, 8, 12, 16):
        rank.keep("hf", step, f"first at {step}", first)
    second = rank.begin("hf")
    for step in (4, 8):
        rank.keep("hf", step, f"second at {step}", second)
    assert store.steps() == [16, 20, 24]  # the second's 4 and 8 above the first's 16
    monkeypatch.setenv(ENV_ATTEMPT, "2")
    rank = resuming.Trainings(checkpoint, resume)
    first = rank.begin("hf")
    assert rank.kept("hf", first) is None  # the latest is the second's
    for step in (4, 8, 12, 16):
        rank.keep("hf", step, f"first at {step}", first)  # trained again from its start
    callback = types.SimpleNamespace(training=None)
    second = rank.begin("hf", [callback])
    assert callback.training == second == 2
    assert rank.kept("hf", second) == (8, "second at 8") and rank.kept("lightning", second) is None
    rank.keep("hf", 12, "second at 12", second)
    assert resume()["state"] == "second at 12"  # above what the last attempt kept: the latest
    monkeypatch.setenv(ENV_RUN, "another run")
    assert rank.kept("hf", second) is None  # not this run's
