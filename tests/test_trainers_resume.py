"""``retries=`` resumes the trainers through their own checkpoints (issue 79): a rank SIGKILLed
mid-epoch, and the retried attempt's ``train()`` / ``fit()``, called as before, resumes from the
latest checkpoint the trainer wrote (kept by the run: on Spark the disk it was written to may be
gone) and ends with the weights of a run never killed. Nothing of hvd_magic's in the cells; the
Killer callback stands for the lost executor."""

from __future__ import annotations

import math

import pytest

from .test_trainers import TINY_BERT

pytestmark = pytest.mark.timeout(400)

# 16 steps, a checkpoint every 4; rank 1 dies at step 10 of the first attempt, after
# checkpoint-8 was written
HF = (
    TINY_BERT
    + """
class Killer(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        pathlib.Path({marks!r}, f"began-{{args.process_index}}-{{state.global_step}}").touch()
    def on_step_end(self, args, state, control, **kwargs):
        first = not os.listdir({marks!r} + "/killed")
        if {kill} and args.process_index == 1 and state.global_step == 10 and first:
            pathlib.Path({marks!r}, "killed", "once").touch()
            os.kill(os.getpid(), 9)
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=16, num_train_epochs=2,
                         report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="steps", save_steps=4)
model = BertForSequenceClassification(config)
trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Killer()])
trainer.train()
(trainer.state.global_step, sum(float(p.double().sum()) for p in trainer.model.parameters()))
"""
)

# 3 epochs of 8 steps; Lightning's own ModelCheckpoint writes one at each epoch's end; rank 1
# dies at step 12 of the first attempt, in the second epoch
LIGHTNING = """
import os, pathlib, tempfile, torch, lightning
torch.manual_seed(0)
x = torch.randn(256, 8)
y = x.sum(1, keepdim=True)
class Net(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)
class Killer(lightning.Callback):
    def on_train_start(self, trainer, module):
        pathlib.Path({marks!r}, f"began-{{trainer.global_rank}}-{{trainer.global_step}}").touch()
    def on_train_batch_end(self, trainer, module, outputs, batch, index):
        first = not os.listdir({marks!r} + "/killed")
        if {kill} and trainer.global_rank == 1 and trainer.global_step == 12 and first:
            pathlib.Path({marks!r}, "killed", "once").touch()
            os.kill(os.getpid(), 9)
trainer = lightning.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=3, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=[Killer()],
                            default_root_dir=tempfile.mkdtemp())
net = Net()
data = torch.utils.data.TensorDataset(x, y)
trainer.fit(net, torch.utils.data.DataLoader(data, batch_size=16, shuffle=True))
(trainer.global_step, sum(float(p.double().sum()) for p in net.parameters()))
"""

# An Accelerate loop as its docs write one, resuming from its own save_state folder when there
# is one: 3 epochs of 8 steps, a save every 4. Rank 1 dies at step 10 of the first attempt, and
# takes the folder with it (as a lost executor's disk would): the run's copy is restored.
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
pathlib.Path({marks!r}, f"began-{{rank}}-{{progress.step}}").touch()
while progress.step < 24:
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
(progress.step, sum(float(p.double().sum()) for p in model.parameters()))
"""


@pytest.mark.parametrize(
    ("cell", "steps", "kept"),
    [(HF, 16, {4, 8}), (LIGHTNING, 24, {8}), (ACCELERATE, 24, {4, 8})],
    ids=["hf", "lightning", "accelerate"],
)
def test_a_killed_rank_is_resumed_from_the_trainers_own_checkpoint(ip, tmp_path, cell, steps, kept):
    killed, never = tmp_path / "killed", tmp_path / "never"
    for marks in (killed, never):
        (marks / "killed").mkdir(parents=True)
    step, weights = ip.run_cell_magic(
        "horovod", "np=-2 backend=torch retries=1", cell.format(marks=str(killed), kill=True)
    )
    assert (killed / "killed" / "once").exists()  # the first attempt lost rank 1
    began = {
        int(name.split("-")[2]) for name in (p.name for p in killed.iterdir()) if name.startswith("began-1-")
    }
    assert began - {0} and began - {0} <= kept, began  # the second attempt began where a checkpoint was
    expected_step, expected = ip.run_cell_magic(
        "horovod", "np=-2 backend=torch", cell.format(marks=str(never), kill=False)
    )
    assert step == expected_step == steps
    assert math.isclose(weights, expected, rel_tol=1e-6, abs_tol=1e-6), (weights, expected)
