"""The trainers people use, in the live view with no hvd_magic code in the cell (issue 79): a
Hugging Face ``Trainer``, a Lightning ``Trainer`` and an Accelerate loop, each on 2 real
torch.distributed ranks on the CPU, report their steps, total, epoch, loss, learning rate and
metrics; the first interrupt stops a trainer at one step on every rank, through its own flag,
and the cell returns rank 0's value; Lightning's ``devices``/``num_nodes`` are checked against
the run."""

from __future__ import annotations

import io
import os
import re
import tempfile

import cloudpickle
import pytest

from hvd_magic import RankFailedError
from hvd_magic.errors import TrainerError
from hvd_magic.options import make_options
from hvd_magic.protocol import ENV_RESIZED
from hvd_magic.rank.trainers.lightning_trainer import check_layout
from hvd_magic.rank.trainers.readings import LossReading, numbers
from hvd_magic.run.checkpoint_store import CheckpointStore
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks
from hvd_magic.widgets.state import RunModel

from .helpers import RecordingView, when_started
from .test_retry import press_once_polling, recorded_stops

pytestmark = pytest.mark.timeout(300)

ROWS = """
import os, pathlib, tempfile, torch
torch.manual_seed(0)
x = torch.randn(256, 8)
y = x.sum(1, keepdim=True)
"""

# A tiny BERT made from its config (nothing downloaded; no dropout: two runs draw nothing
# different) and 256 rows of it (a template: braces doubled)
TINY_BERT = """
import os, pathlib, tempfile, torch
from transformers import BertConfig, BertForSequenceClassification
from transformers import Trainer, TrainerCallback, TrainingArguments
torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        mask = torch.ones(16, dtype=torch.long)
        return {{"input_ids": ids, "attention_mask": mask, "labels": int(ids[0] % 2)}}
"""

# 16 a device, 2 ranks: 2 epochs are 16 steps
HF = (
    TINY_BERT
    + """
args = TrainingArguments(output_dir={output!r}, per_device_train_batch_size=16, report_to=[], use_cpu=True,
                         disable_tqdm=True, logging_steps=4, {arguments})
trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Rows(), {more})
{before}
result = trainer.train()
(trainer.args.world_size, result.global_step, {value})
"""
)

LIGHTNING = """
import tempfile, torch, lightning
class Net(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def validation_step(self, batch, index):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(x, y)
trainer = lightning.Trainer(accelerator="cpu", strategy="ddp", {layout}, max_epochs={epochs}, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=tempfile.mkdtemp())
{before}
loader = torch.utils.data.DataLoader
trainer.fit(Net(), loader(data, batch_size=16), loader(data, batch_size=64))
(trainer.world_size, trainer.global_step, trainer.should_stop)
"""

ACCELERATE = """
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(8, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
for epoch in range(2):
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.log({"epoch_loss": loss.item()})
(accelerator.num_processes, round(loss.item(), 6))
"""


def watched(cell: str, env: str | None = None, **options: object) -> tuple[object, RunModel]:
    """The cell on 2 torch.distributed ranks: rank 0's value, and the live view's model of it."""
    view = RecordingView()
    value, _ = run_on_ranks(
        pack_cell(cell, {}), make_options(np=-2, backend="torch", env=env, **options), view
    )
    model = RunModel(2)
    for message in view.messages:
        model.apply(message)
    return value, model


def test_a_hugging_face_trainer_feeds_the_view_and_one_mlflow_run(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.chdir(tmp_path)  # a SQLite store's artifacts go to ./mlruns
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        hugging_face_trainer_fed_the_view(tmp_path, mlflow.MlflowClient())
    finally:
        mlflow.set_tracking_uri(previous)


def hugging_face_trainer_fed_the_view(tmp_path, client) -> None:
    cell = HF.format(
        output=str(tmp_path),
        arguments='num_train_epochs=2, save_strategy="no", eval_strategy="epoch"',
        more="eval_dataset=Rows()",
        before="",
        value="len(trainer.callback_handler.callbacks)",
    )
    (size, steps, callbacks), model = watched(cell, mlflow="yes")
    assert (size, steps) == (2, 16)  # 256 rows, 16 a device on 2 ranks, 2 epochs
    for progress in model.progress:
        assert (progress.step, progress.total, progress.epoch) == (16, 16, 1)
    for rank in (0, 1):
        assert model.series["loss"][rank].steps[0] == 1.0  # each rank's own, from its first step
        assert len(model.series["learning_rate"][rank].steps) == 16
        assert model.series["eval_loss"][rank].steps == [8.0, 16.0]  # what the trainer evaluated
        assert model.series["grad_norm"][rank].steps == [4.0, 8.0, 12.0, 16.0]  # what it logged
    assert "eval_runtime" not in model.series and "epoch" not in model.series  # not curves
    (run,) = client.search_runs(["0"])  # one run for the two ranks, not one each
    logged = client.get_metric_history(run.info.run_id, "learning_rate")
    assert sorted(m.step for m in logged) == list(range(1, 17))  # the ranks' mean, each step
    assert {"loss", "eval_loss", "grad_norm"} <= set(run.data.metrics)


def test_a_callback_given_by_hand_is_the_only_one(tmp_path):
    cell = HF.format(
        output=str(tmp_path),
        arguments='max_steps=2, save_strategy="no"',
        more="callbacks=[HFCallback()]",
        before="",
        value="sum(isinstance(c, HFCallback) for c in trainer.callback_handler.callbacks)",
    )
    (_, steps, mine), model = watched("from hvd_magic.integrations import HFCallback\n" + cell)
    assert steps == 2 and mine == 1
    assert [progress.step for progress in model.progress] == [2, 2]


def test_the_first_interrupt_stops_a_hugging_face_trainer_at_one_step_and_keeps_its_checkpoint(
    ip, tmp_path, monkeypatch
):
    stops = recorded_stops(monkeypatch)
    when_started(tmp_path, 2, lambda: press_once_polling(stops))
    cell = HF.format(
        output=str(tmp_path / "out"),
        arguments='max_steps=100_000, save_strategy="no"',
        more="",
        before=f"pathlib.Path({str(tmp_path)!r}, f'started-{{trainer.args.process_index}}').touch()",
        value=f"sorted(os.listdir({str(tmp_path / 'out')!r}))",
    )
    size, step, saved = ip.run_cell_magic("horovod", "np=-2 backend=torch", "import os, pathlib\n" + cell)
    assert size == 2 and 0 < step < 100_000  # train() returned; it would hang had a rank gone on alone
    assert saved == [f"checkpoint-{step}"]  # the trainer's own checkpoint, where it stopped


def first_losses(cell: str) -> tuple[object, list[float]]:
    """Rank 0's value, and each rank's first step's loss as the live view has it."""
    value, model = watched(cell)
    return value, [model.series["loss"][rank].values[0] for rank in (0, 1)]


@pytest.mark.parametrize("accumulated", [1, 4])
def test_a_hugging_face_steps_loss_is_the_one_the_trainer_logs_however_its_rows_come(accumulated):
    """16 rows a rank in the first step, in one batch or in 4 accumulated batches of 4: rank 0's
    loss in the view is the one the trainer itself logs for the step (the sum of its
    batches' training_step values; the last batch's alone was a quarter of it, or all of it,
    as the trainer scales each)."""
    cell = HF.format(
        output=tempfile.mkdtemp(),
        arguments='max_steps=1, save_strategy="no"',
        more="",
        before="",
        value="trainer.state.log_history[-1]['train_loss']",
    ).replace("per_device_train_batch_size=16", f"per_device_train_batch_size={16 // accumulated}, "
              f"gradient_accumulation_steps={accumulated}")  # fmt: skip
    (_, _, logged), losses = first_losses(cell)
    assert losses[0] == pytest.approx(logged, rel=1e-6)  # rank 0's, which logs its own


def test_a_lightning_steps_loss_is_the_same_whether_its_rows_come_in_one_batch_or_accumulated():
    """Lightning divides each batch's loss by accumulate_grad_batches: the step's is their sum."""
    lightning = ROWS + LIGHTNING.format(layout="devices=2", epochs=1, before="").replace(
        "max_epochs=1", "max_epochs=1, max_steps=1"
    )
    in_fours = lightning.replace("max_steps=1", "max_steps=1, accumulate_grad_batches=4").replace(
        "loader(data, batch_size=16)", "loader(data, batch_size=4)"
    )
    assert in_fours.count("accumulate_grad_batches=4") == 1 and "batch_size=4)" in in_fours
    assert first_losses(lightning)[1] == pytest.approx(first_losses(in_fours)[1], rel=1e-5)


def test_the_checkpoint_the_run_keeps_has_every_ranks_part(tmp_path):
    """The HF trainer writes rank 1's RNG state into checkpoint-4 with no wait for it; rank 1
    writes it late here (a loaded host): the run's copy has it whole, rank 0 having waited."""
    late = (
        "if os.environ['RANK'] == '1':\n"
        "    import time\n"
        "    save_rng = Trainer._save_rng_state\n"
        "    Trainer._save_rng_state = lambda self, folder: (time.sleep(1.0), save_rng(self, folder))\n"
    )
    cell = HF.format(
        output=str(tmp_path / "out"),
        arguments='max_steps=4, save_strategy="steps", save_steps=4',
        more="",
        before=late,
        value="0",
    )
    store = tmp_path / "store"
    (_, steps, _), _ = watched(cell, checkpoint_dir=str(store))
    kept = CheckpointStore(str(store)).latest()
    assert steps == 4 and kept is not None and kept[0] == 4
    files = cloudpickle.loads(kept[1])["state"]
    import torch  # here: collecting the module imports no torch

    for rank in (0, 1):
        state = torch.load(io.BytesIO(files[f"rng_state_{rank}.pth"]), weights_only=False)
        assert "cpu" in state, sorted(state)


def test_the_lightning_callback_given_by_hand_is_the_one_a_rank_adds():
    cell = (
        "import lightning\nfrom hvd_magic.integrations import LightningCallback as mine\n"
        "from hvd_magic.rank.trainers.lightning_trainer import callback_class\n"
        "(mine is callback_class('lightning.pytorch'), issubclass(mine, lightning.Callback))"
    )
    value, _ = run_on_ranks(pack_cell(cell, {}), make_options(np=-1, backend="torch"), RecordingView())
    assert value == (True, True)


@pytest.mark.parametrize("layout", ["devices=2", "devices=1, num_nodes=2"])
def test_a_lightning_trainer_feeds_the_view_in_either_layout(layout):
    (size, steps, stopped), model = watched(ROWS + LIGHTNING.format(layout=layout, epochs=2, before=""))
    assert (size, steps, stopped) == (2, 16, False)
    for progress in model.progress:
        assert (progress.step, progress.total, progress.epoch) == (16, 16, 1)
    for rank in (0, 1):
        assert model.series["loss"][rank].steps[0] == 1.0
        assert model.series["val_loss"][rank].steps == [8.0, 16.0]
        assert set(model.series["learning_rate"][rank].values) == {0.1}


def test_the_first_interrupt_stops_a_lightning_trainer(ip, tmp_path, monkeypatch):
    stops = recorded_stops(monkeypatch)
    when_started(tmp_path, 2, lambda: press_once_polling(stops))
    before = f"pathlib.Path({str(tmp_path)!r}, 'started-' + os.environ['RANK']).touch()"
    cell = ROWS + LIGHTNING.format(layout="devices=2", epochs=100_000, before=before)
    size, steps, stopped = ip.run_cell_magic("horovod", "np=-2 backend=torch", cell)
    assert size == 2 and stopped and 0 < steps < 100_000 * 8


def test_lightning_numbers_that_do_not_make_the_run_are_refused_naming_the_right_ones(ip):
    cell = ROWS + LIGHTNING.format(layout="devices=4", epochs=1, before="")
    with pytest.raises(RankFailedError) as info:
        ip.run_cell_magic("horovod", "np=-2 backend=torch", cell)
    assert (
        "TrainerError: Lightning's Trainer(devices=4, num_nodes=1) makes 4 processes, but this run has 2 "
        "ranks (2 on each of 1 host): write devices=2, num_nodes=1, or devices=1, num_nodes=2, or change np"
    ) in str(info.value)


def test_an_accelerate_loop_feeds_the_view():
    (size, loss), model = watched(ROWS + ACCELERATE)
    assert size == 2 and loss < 0.5
    assert [progress.step for progress in model.progress] == [16, 16]  # each optimizer step
    for rank in (0, 1):
        assert model.series["loss"][rank].steps[0] == 1.0
        assert model.series["epoch_loss"][rank].steps == [8.0, 16.0]  # what the loop logged, each rank


def test_the_first_interrupt_stops_an_accelerate_loop_where_it_checks_its_trigger(ip, tmp_path, monkeypatch):
    stops = recorded_stops(monkeypatch)
    when_started(tmp_path, 2, lambda: press_once_polling(stops))
    cell = f"""
import os, pathlib, torch
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(8, 1)
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
pathlib.Path({str(tmp_path)!r}, "started-" + os.environ["RANK"]).touch()
for step in range(1, 10**6):
    accelerator.backward(model(torch.randn(16, 8)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
    if accelerator.check_trigger():  # Accelerate's way to stop every process at once
        break
step
"""
    assert 0 < ip.run_cell_magic("horovod", "np=-2 backend=torch", cell) < 10**6 - 1


def test_the_trainers_can_be_left_alone():
    cell = ROWS + LIGHTNING.format(layout="devices=1, num_nodes=2", epochs=1, before="")
    with pytest.raises(RankFailedError, match="IndexError"):  # Lightning's own reading of it, as before
        watched(cell, env="HVD_MAGIC_TRAINERS=0")


# The pure parts


def test_lightning_layouts_against_the_runs_ranks(monkeypatch):
    def run_of(size: int, local: int) -> None:
        monkeypatch.setenv("WORLD_SIZE", str(size))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
        monkeypatch.setenv("GROUP_WORLD_SIZE", str(size // local))
        monkeypatch.setenv("RANK", "3")
        monkeypatch.setenv("LOCAL_RANK", "1")
        monkeypatch.setenv("GROUP_RANK", "1")

    run_of(4, 2)
    assert check_layout(2, 2) == (2, 2)  # the ranks a host, the hosts: as it is
    assert check_layout("auto", 1) == ("auto", 1)  # Lightning's own reading
    assert os.environ["LOCAL_RANK"] == "1"
    assert check_layout(1, 4) == (1, 4)  # a node a process: each rank its own node
    as_a_node = (os.environ["LOCAL_RANK"], os.environ["GROUP_RANK"], os.environ["LOCAL_WORLD_SIZE"])
    assert as_a_node == ("0", "3", "1")
    run_of(4, 2)
    with pytest.raises(TrainerError, match=re.escape("devices=2, num_nodes=2, or devices=1, num_nodes=4")):
        check_layout(4, 2)
    run_of(2, 1)  # Spark: a task a host
    with pytest.raises(
        TrainerError, match=re.escape("(1 on each of 2 hosts): write devices=1, num_nodes=2, or c")
    ):
        check_layout(2, 1)
    # min_np=: an attempt of fewer ranks than the numbers were written for runs on those it has
    run_of(2, 2)
    monkeypatch.setenv(ENV_RESIZED, "4,2")
    assert check_layout(4, 1) == (2, 1)
    run_of(3, 1)  # Spark, a task a host, one host lost: the one-process-a-node form kept
    assert check_layout(1, 4) == (1, 3) and os.environ["LOCAL_RANK"] == "0"
    run_of(3, 2)  # 2 ranks on this host, 1 on the other: no devices x num_nodes makes 3 but 1 x 3
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert check_layout(2, 2) == (1, 3) and os.environ["LOCAL_RANK"] == "0"
    monkeypatch.delenv(ENV_RESIZED)
    with pytest.raises(TrainerError, match=re.escape("makes 4 processes, but this run has 3 ranks")):
        check_layout(4, 1)  # not resized: the numbers are the user's mistake
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert check_layout(8, 8) == (8, 8)  # not a run of ours: nothing checked


def test_a_loss_is_read_at_most_ten_times_a_second():
    now = [100.0]
    reading = LossReading(clock=lambda: now[0])
    assert reading.read(2.5) == 2.5 and reading.read(3.0) is None
    now[0] += 0.15
    assert reading.read(None) is None and reading.read(3.0) == 3.0


def test_only_numbers_are_curves():
    given = {"a": 1, "b": "x", "c": True, "d": 2.5, "loss": 3}
    assert numbers(given, leave=("loss",)) == {"a": 1.0, "d": 2.5}
