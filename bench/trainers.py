"""Trainers benchmark: what hvd_magic's callback adds to a Hugging Face or Lightning step.

A rank adds its callback to every HF and Lightning ``Trainer`` it builds (``rank.trainers``):
at each step a report, the loss read at most ten times a second, and the stop check
(``StoppingLate``: a two-number allreduce started in the background about every 50 ms of steps,
read a few steps later). Whole runs with and without it differ by far more than that from run
to run on a shared machine (two trainers trained in turn on 2 ranks here: +-6 %), so this
times the callback itself: one trainer of a tiny model on 2 ranks, ``STEPS`` steps, each of the
callback's step hooks timed where it runs, on the training thread, against the step (from one
step's start to the next's). Printed: the medians, and the hooks' share of the step. Target
(issue 79): <= 1 %.

Usage: python bench/trainers.py [--steps 400] [--trainers hf,lightning]
"""

from __future__ import annotations

import argparse

from figures import keep
from timing import QuietView

from hvd_magic.options import make_options
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks

# Each rank: ``HOOKS`` (the callback's class and its step hooks' names) and ``train(steps)``,
# which trains ``steps`` steps and returns each step's seconds; the hooks' seconds are gathered
# in ``spent`` as they run.
TIMED = """
import functools, statistics, time
spent = []
def timed(hook):
    @functools.wraps(hook)
    def run(*args, **kwargs):
        start = time.perf_counter()
        try:
            return hook(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)
    return run
for name in HOOKS[1]:
    setattr(HOOKS[0], name, timed(getattr(HOOKS[0], name)))
steps = train(STEPS)[20:]  # the first steps are slow (allocators, DDP's buckets)
(statistics.median(spent[20:]), statistics.median(steps))
"""

HF = """
import time, torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from hvd_magic.integrations import HFCallback
HOOKS = (HFCallback, ("on_step_end", "on_log"))
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
def train(steps):
    clock = Clock()
    args = TrainingArguments(output_dir="/tmp/hvd-bench-trainers", per_device_train_batch_size=64,
                             max_steps=steps + 1, report_to=[], use_cpu=True, disable_tqdm=True,
                             save_strategy="no", logging_steps=10)
    Trainer(model=Net(), args=args, train_dataset=Rows(), callbacks=[clock]).train()
    return [b - a for a, b in zip(clock.begins, clock.begins[1:])]
"""

LIGHTNING = """
import time, torch, lightning
from hvd_magic.integrations import LightningCallback
HOOKS = (LightningCallback, ("on_train_batch_end", "on_validation_end"))
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
def train(steps):
    clock = Clock()
    trainer = lightning.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_steps=steps + 1,
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, callbacks=[clock])
    trainer.fit(Net(), loader)
    return [b - a for a, b in zip(clock.begins, clock.begins[1:])]
"""

CELLS = {"hf": HF, "lightning": LIGHTNING}


def cost(name: str, steps: int) -> tuple[float, float]:
    """Rank 0's median seconds in the callback's step hooks, and its median step (2 ranks)."""
    cell = CELLS[name] + f"STEPS = {steps}\n" + TIMED
    (hooks, step), _ = run_on_ranks(pack_cell(cell, {}), make_options(np=-2, backend="torch"), QuietView())
    return float(hooks), float(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--trainers", default="hf,lightning")
    args = parser.parse_args()
    print(f"trainers' callback: its step hooks' time on 2 ranks, {args.steps} steps")
    figures = {}
    for name in args.trainers.split(","):
        hooks, step = cost(name, args.steps)
        share = 100 * hooks / step
        print(
            f"  {name:9s} hooks {1e6 * hooks:5.0f} us of a {1e3 * step:6.3f} ms step = {share:5.2f} %"
            "   target <= 1 %"
        )
        figures |= {f"{name}_share": f"{share:.2f} %", f"{name}_step": f"{1e3 * step:.1f} ms"}
    keep("trainers", figures)


if __name__ == "__main__":
    main()
