"""Straggler timing benchmark: what timing the waits in collectives adds to a training step.

The straggler watch (on by default) times each rank's waits in collectives: DDP's gradient
allreduce (``collective_ddp``: on the host's clock on the CPU, with CUDA events on a GPU),
Horovod-torch's ``synchronize``
(``collective_time.timed``), Horovod-TensorFlow's gradient allreduce in the graph
(``collective_tf.timed``). Whole runs with and without it differ here by up to 10 % from run to
run (a shared 2-core machine), and even two copies trained in turn on 2 ranks by ±3 %
(their collectives interleave): far more than the cost sought. So this measures the cost itself:
one rank (no other rank to wait for, so the waits are nothing and only the timing's own work
differs) trains two copies of the same small model (two Linear layers, 64-row batches), one
timed and one not, a step of each in turn, which goes first alternating. Printed: the untimed
copy's median step, the median of each timed step's excess over the untimed step beside it (a
step the machine's other work caught moves it little), and that excess as a share of the same
model's step on 2 ranks (measured in the same run). Target (issue 41): <= 1 %. ``--device cuda`` measures the
torch paths on a GPU (the GPU check runs it): one GPU cannot hold 2 NCCL ranks, so the cost is
a share of the 1-rank step there, a stricter measure. The timed copy is timed every step here
(``HVD_MAGIC_TIMING_LIMIT=off``); ``limits_itself`` runs DDP's timing as a rank does, left to its
limit, which switches it off where it costs over 1 % of the step (``rank.timing_cost``).

Usage: python bench/stragglers.py [--steps 3000] [--paths ddp,horovod,keras] [--device cuda]
"""

from __future__ import annotations

import argparse

from figures import keep
from timing import QuietView

from hvd_magic.options import make_options
from hvd_magic.protocol import ENV_TIMING_LIMIT, Message, TimingOff
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks

TORCH_MODELS = """
import time, torch
torch.manual_seed(0)
def net():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    return model.to(DEVICE)
x, y = torch.randn(64, 256, device=DEVICE), torch.randint(0, 10, (64,), device=DEVICE)
SYNC = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)  # a step's kernels done
"""

# ``models`` maps "timed" and "off" to a function running one training step of that copy.
INTERLEAVED = """
import statistics
spent = {"timed": [], "off": []}
for i in range(20 + STEPS):
    for name in (("timed", "off") if i % 2 else ("off", "timed")):
        start = time.perf_counter()
        models[name]()
        SYNC()
        if i >= 20:
            spent[name].append(time.perf_counter() - start)
added = statistics.median(t - o for t, o in zip(spent["timed"], spent["off"]))  # pair by pair
(statistics.median(spent["off"]) + added, statistics.median(spent["off"]))
"""

DDP = (
    TORCH_MODELS
    + """
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_ddp
dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
class Untimed(DDP):
    forward = DDP.forward  # DDP's own, kept before the rank's timing wraps it
collective_ddp.time_ddp()  # as a rank with stragglers on: DDP models timed from their first step
def stepper(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step
timed, off = DDP(net()), Untimed(net())
models = {"timed": stepper(timed), "off": stepper(off)}
"""
)

HOROVOD = (
    TORCH_MODELS
    + """
import horovod.torch as hvd, horovod.torch.optimizer as optimizer
from hvd_magic.rank import collective_time
hvd.init()
plain = optimizer.synchronize
timed_sync = collective_time.timed(plain)
def stepper(name, model, sync):
    named = [(f"{name}.{n}", p) for n, p in model.named_parameters()]  # the same on every rank
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=named)
    def step():
        optimizer.synchronize = sync  # what the optimizer's step waits in
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step
models = {"timed": stepper("timed", net(), timed_sync), "off": stepper("off", net(), plain)}
"""
)

KERAS = """
import time, numpy as np, tensorflow as tf, horovod.tensorflow.keras as hvd
SYNC = lambda: None  # train_on_batch returns with its step done
from hvd_magic.rank import collective_tf
hvd.init()
tf.random.set_seed(0)
def compiled():
    model = tf.keras.Sequential([tf.keras.layers.Dense(512, activation="relu", input_shape=(256,)),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
x, y = np.random.rand(64, 256).astype("float32"), np.random.randint(0, 10, 64)
off = compiled()                      # made before the timing is in place: not timed
collective_tf.time_tensorflow()
timed = compiled()
models = {"timed": lambda: timed.train_on_batch(x, y), "off": lambda: off.train_on_batch(x, y)}
"""

PATHS = {"ddp": DDP, "horovod": HOROVOD, "keras": KERAS}

# DDP's timing as a rank with stragglers on runs it (left to its limit); its value: whether it is off
LIMITED = (
    TORCH_MODELS
    + """
import torch.distributed as dist, hvd_magic
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_time
dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
model = DDP(net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, STEPS + 1):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    hvd_magic.report(step=step)
collective_time.waited() is None
"""
)


def seconds(path: str, steps: int, np: int = -1, device: str = "cpu") -> tuple[float, float]:
    """Rank 0's median step of the untimed copy plus the median of what each timed step took
    over the untimed step beside it, and that median untimed step, in seconds (medians, pair by
    pair: a step caught by the machine's other work, or by Horovod's cycle, moves neither)."""
    torch = path == "ddp"
    options = make_options(
        np=np,
        backend="torch" if torch else None,
        launcher=None if torch else "gloo",
        stragglers="off",
        env={ENV_TIMING_LIMIT: "off"},  # timed every step, its cost as it is
    )
    cell = f"DEVICE = {device!r}\nSTEPS = {steps}\n" + PATHS[path] + INTERLEAVED
    (timed, off), _ = run_on_ranks(pack_cell(cell, {}), options, QuietView())  # rank 0's value
    return float(timed), float(off)


def limits_itself(device: str = "cpu", steps: int = 400) -> tuple[bool, list[str]]:
    """DDP's timing left to its limit on 1 rank for ``steps`` steps (the limit's probe takes
    230): whether it is off at the end, and what the rank said of it (the view's line)."""
    said: list[str] = []

    class Said(QuietView):
        def message(self, message: object) -> None:
            if isinstance(message, Message) and isinstance(message.record, TimingOff):
                said.append(message.record.text(message.rank))

    cell = f"DEVICE = {device!r}\nSTEPS = {steps}\n" + LIMITED
    off, _ = run_on_ranks(pack_cell(cell, {}), make_options(np=-1, backend="torch"), Said())
    return bool(off), said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--paths", default="ddp,horovod,keras")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    print(f"straggler timing: its cost on 1 rank, {args.steps} steps of each copy, in turn, {args.device}")
    figures = {}
    for path in args.paths.split(","):
        line, added, share, base = cost(path, args.steps, args.device)
        print(f"  {path:8s} {line}")
        figures |= {f"{path}_added": f"{1e6 * added:+.0f} µs", f"{path}_share": f"{100 * share:+.2f} %"}
        figures[f"{path}_step"] = f"{1e3 * base:.1f} ms"
    if args.device == "cpu":
        keep("stragglers", figures)


def cost(path: str, steps: int, device: str = "cpu") -> tuple[str, float, float, float]:
    """One path's line (each copy's step, the added time and its share: see the module's text),
    the seconds added a step, their share and the step they are a share of."""
    timed, off = seconds(path, steps, device=device)
    if device == "cpu":
        _, base = seconds(path, steps // 3, np=-2)  # the step the cost is a share of
        of = f"a 2-rank step ({1e3 * base:5.2f} ms)"
    else:
        base, of = off, f"the 1-rank step ({1e3 * off:5.2f} ms)"
    added = timed - off
    line = (
        f"1 rank: timed {1e3 * timed:6.3f} ms, not {1e3 * off:6.3f} ms a step: added "
        f"{1e6 * added:+4.0f} us = {100 * added / base:+5.2f} % of {of}   target <= 1 %"
    )
    return line, added, added / base, base


if __name__ == "__main__":
    main()
