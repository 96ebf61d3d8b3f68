"""Trainers benchmark: what hvd_magic's callback adds to a Hugging Face or Lightning step.

A rank adds its callback to every HF and Lightning ``Trainer`` it builds (``rank.trainers``):
a report each step, the loss read at most ten times a second, and ``hvd_magic.stopping()`` (a
one-number allreduce) at each step's end. Whole runs with and without it differ by more than
that from run to run on a shared machine, so this trains, in one cell on 2 ranks, two
identical trainers of the same tiny model, one with the callback and one without, a few steps
of each in turn (ABBA), and compares their median steps. A step is the time from one
``on_step_begin`` (HF) or ``on_train_batch_start`` (Lightning) to the next, so the callback's
work, wherever it falls, is inside it. Target (issue 79): <= 1 % of the step.

Usage: python bench/trainers.py [--steps 400] [--trainers hf,lightning]
"""

from __future__ import annotations

import argparse

from figures import keep
from timing import QuietView

from hvd_magic.options import make_options
from hvd_magic.run.capture import capture_cell
from hvd_magic.run.supervisor import execute

# Each rank: ``train(with_callback, steps)`` trains that copy ``steps`` steps more and returns
# the seconds of each; the copies alternate in blocks of BLOCK steps, in ABBA order.
IN_TURN = """
import statistics
BLOCK = 20
spent = {True: [], False: []}
for block in range(STEPS // BLOCK):
    order = (True, False) if block % 4 in (0, 3) else (False, True)
    for mine in order:
        spent[mine] += train(mine, BLOCK)[1:]  # the first step of a block waits for the last block's end
(statistics.median(spent[True]), statistics.median(spent[False]))
"""

HF = """
import time, torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from hvd_magic.integrations import HFCallback
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layer = torch.nn.Linear
        self.layers = torch.nn.Sequential(layer(256, 512), torch.nn.ReLU(), layer(512, 10))
    def forward(self, x, labels):
        return {"loss": torch.nn.functional.cross_entropy(self.layers(x), labels)}
class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        return {"x": torch.randn(256), "labels": i % 10}
class Clock(TrainerCallback):
    def __init__(self):
        self.begins = []
    def on_step_begin(self, args, state, control, **kwargs):
        self.begins.append(time.perf_counter())
def trainer(mine):
    clock = Clock()
    args = TrainingArguments(output_dir="/tmp/hvd-bench-trainers", per_device_train_batch_size=64,
                             max_steps=10**6, report_to=[], use_cpu=True, disable_tqdm=True,
                             save_strategy="no", logging_steps=10**6)
    built = Trainer(model=Net(), args=args, train_dataset=Rows(), callbacks=[clock])
    if not mine:
        built.remove_callback(HFCallback)
    return built, clock
trainers = {mine: trainer(mine) for mine in (True, False)}
class Enough(TrainerCallback):
    def __init__(self, steps):
        self.left = steps
    def on_step_end(self, args, state, control, **kwargs):
        self.left -= 1
        if self.left <= 0:
            control.should_training_stop = True
def train(mine, steps):
    built, clock = trainers[mine]
    enough = Enough(steps + 1)
    built.add_callback(enough)
    clock.begins = []
    built.train()
    built.remove_callback(enough)
    return [b - a for a, b in zip(clock.begins, clock.begins[1:])]
"""

LIGHTNING = """
import time, torch, lightning
torch.manual_seed(0)
class Net(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        layer = torch.nn.Linear
        self.layers = torch.nn.Sequential(layer(256, 512), torch.nn.ReLU(), layer(512, 10))
    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layers(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
class Clock(lightning.Callback):
    def __init__(self):
        self.begins = []
    def on_train_batch_start(self, trainer, module, batch, index):
        self.begins.append(time.perf_counter())
x, y = torch.randn(64 * 50, 256), torch.randint(0, 10, (64 * 50,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
def train(mine, steps):
    clock = Clock()
    built = lightning.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_steps=steps + 1,
                              logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False, callbacks=[clock])
    if not mine:
        built.callbacks = [c for c in built.callbacks if type(c).__name__ != "LightningCallback"]
    built.fit(Net(), loader)
    return [b - a for a, b in zip(clock.begins, clock.begins[1:])]
"""

CELLS = {"hf": HF, "lightning": LIGHTNING}


def cost(name: str, steps: int) -> tuple[float, float]:
    """Rank 0's median step with the callback and without, in seconds (2 ranks, in turn)."""
    cell = CELLS[name] + f"STEPS = {steps}\n" + IN_TURN
    (mine, plain), _ = execute(capture_cell(cell, {}), make_options(np=-2, backend="torch"), QuietView())
    return float(mine), float(plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--trainers", default="hf,lightning")
    args = parser.parse_args()
    print(f"trainers' callback: its cost on 2 ranks, {args.steps} steps of each copy, in turn")
    figures = {}
    for name in args.trainers.split(","):
        mine, plain = cost(name, args.steps)
        share = 100 * (mine - plain) / plain
        print(
            f"  {name:9s} with it {1e3 * mine:6.3f} ms, without {1e3 * plain:6.3f} ms a step: "
            f"added {1e6 * (mine - plain):+5.0f} us = {share:+5.2f} %   target <= 1 %"
        )
        figures |= {f"{name}_share": f"{share:+.2f} %", f"{name}_step": f"{1e3 * plain:.1f} ms"}
    keep("trainers", figures)


if __name__ == "__main__":
    main()
