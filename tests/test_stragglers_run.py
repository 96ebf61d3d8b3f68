"""A straggler, for real: two local ranks (backend=torch, so no Horovod to start) report their
steps with ``hvd_magic.report``; rank 1 sleeps a second a step until the view has named it, then
keeps pace. The view names rank 1 once, with its host and a likely reason, then says it caught
up; the run's record keeps both. The view itself flips the ranks' switches (files), so the test
waits on the run's own events, with generous bounds (the rule is short: 50 % for 2 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hvd_magic.options import RunOptions, make_options
from hvd_magic.protocol import Message, Started, Straggler
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks

from .helpers import RecordingView, leftover_processes

CELL = """import os, pathlib, time, hvd_magic
switches = pathlib.Path({folder!r})
rank, step, deadline = int(os.environ["RANK"]), 0, time.time() + 300
while not (switches / "stop").exists() and time.time() < deadline:
    slowed = rank == 1 and not (switches / "recover").exists()
    time.sleep(1.0 if slowed else 0.05)
    step += 1
    hvd_magic.report(step=step)
step
"""

REASONS = ("data wait", "CPU saturated", "memory swapping", "GPU busy")


class SwitchingView(RecordingView):
    """Lets rank 1 recover once it is named, and stops both ranks once it has caught up."""

    def __init__(self, switches: Path) -> None:
        super().__init__()
        self.switches = switches

    def message(self, message: Message) -> None:
        super().message(message)
        if isinstance(message.record, Straggler):
            (self.switches / ("stop" if message.record.recovered else "recover")).touch()

    def stragglers(self) -> list[Straggler]:
        return [m.record for m in self.messages if isinstance(m.record, Straggler)]

    def host(self, rank: int) -> str:
        return next(m.record.host for m in self.messages if isinstance(m.record, Started) and m.rank == rank)


def test_a_slowed_rank_is_named_with_its_host_and_reason_then_cleared(tmp_path):
    view = SwitchingView(tmp_path)
    options = make_options(np=-2, backend="torch", stragglers="0.5/2", logdir=str(tmp_path / "logs"))
    steps, _ = run_on_ranks(pack_cell(CELL.format(folder=str(tmp_path)), {}), options, view)
    said = view.stragglers()  # exactly these two: rank 1 named once, then cleared once
    assert [(s.slow_rank, s.recovered) for s in said] == [(1, False), (1, True)], said
    named, recovered = said
    assert named.host and named.host == view.host(1) == recovered.host
    assert named.reason.startswith(REASONS), named.reason
    assert named.rate < 0.5 * named.median and recovered.rate >= 0.5 * recovered.median
    assert (tmp_path / "stop").exists() and steps > 0  # the run ended because it caught up
    assert leftover_processes() == []
    (run,) = (tmp_path / "logs").iterdir()  # TensorBoard: 1 from when it was named, 0 from when it caught up
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(str(run), size_guidance={"scalars": 0})
    assert [event.value for event in events.Reload().Scalars("stragglers/rank_1")] == [1.0, 0.0]
    assert "stragglers/rank_0" not in events.Tags()["scalars"]


LOCK_STEP = """import os, pathlib, time, torch, hvd_magic
import horovod.torch as hvd
hvd.init()
switches = pathlib.Path({folder!r})
step, deadline = 0, time.time() + 120
while time.time() < deadline:
    slowed = hvd.rank() == 1 and not (switches / "recover").exists()
    time.sleep(1.0 if slowed else 0.05)  # rank 1's input is slow until the view names it
    done = hvd.allreduce(torch.tensor([float((switches / "stop").exists())]), name="stop")
    step += 1
    hvd_magic.report(step=step)
    if done.item() > 0:
        break
step
"""


def test_in_lock_step_horovod_training_the_rank_the_others_wait_for_is_named(tmp_path):
    """Horovod ranks in lock-step (an allreduce every step) make the same steps/s; rank 0 waits
    in the allreduce for rank 1. Their waits, timed in Horovod's own ``synchronize``, single
    rank 1 out, with the share of its time spent outside collectives."""
    named = named_in_lock_step(LOCK_STEP, make_options(np=-2, stragglers="0.5/2"), tmp_path)
    assert "of its own work (outside collectives)" in named.text() and "outside collectives;" in named.reason


def named_in_lock_step(cell: str, options: RunOptions, tmp_path: Path) -> Straggler:
    """Runs a lock-step ``cell`` whose rank 1 is slow until named; the straggler named, once
    it has been named (rank 1, with its host and most of its time outside collectives) and
    cleared, and the run left nothing behind."""
    view = SwitchingView(tmp_path)
    steps, _ = run_on_ranks(pack_cell(cell.format(folder=str(tmp_path)), {}), options, view)
    said = view.stragglers()
    assert [(s.slow_rank, s.recovered) for s in said] == [(1, False), (1, True)], said
    named = said[0]
    assert named.host == view.host(1) and named.outside > 0.8, named
    assert steps > 0 and leftover_processes() == []
    return named


DDP_LOCK_STEP = """import os, pathlib, time, torch, hvd_magic
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(8, 1))
switches = pathlib.Path({folder!r})
step, deadline = 0, time.time() + 120
while time.time() < deadline:
    slowed = dist.get_rank() == 1 and not (switches / "recover").exists()
    time.sleep(1.0 if slowed else 0.05)  # rank 1's input is slow until the view names it
    model(torch.randn(4, 8)).sum().backward()  # DDP: rank 0 waits here for rank 1's gradients
    done = torch.tensor([float((switches / "stop").exists())])
    dist.all_reduce(done)
    step += 1
    hvd_magic.report(step=step)
    if done.item() > 0:
        break
step
"""


def test_in_lock_step_ddp_training_the_rank_the_others_wait_for_is_named(tmp_path):
    """DDP ranks wait in C++, at the end of backward, for the gradients' allreduce: timed from the
    autograd engine (last gradient accumulated to the end of backward), from the model's first
    training forward."""
    named_in_lock_step(DDP_LOCK_STEP, make_options(np=-2, backend="torch", stragglers="0.5/2"), tmp_path)


KERAS_LOCK_STEP = """import pathlib, time, numpy as np, hvd_magic
import horovod.tensorflow.keras as hvd
import tensorflow as tf
hvd.init()
switches, deadline = pathlib.Path({folder!r}), time.time() + 120

class SlowInput(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):  # rank 1's input is slow until the view names it
        time.sleep(1.0 if hvd.rank() == 1 and not (switches / "recover").exists() else 0.05)

class StopTogether(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        asked = float((switches / "stop").exists() or time.time() > deadline)
        self.model.stop_training = hvd.allreduce(tf.constant([asked]), name="stop").numpy()[0] > 0

model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
callbacks = [SlowInput(), hvd_magic.LiveCallback(), StopTogether()]
fit = model.fit(np.ones((64, 8)), np.ones((64, 1)), batch_size=8, epochs=1000, verbose=0, callbacks=callbacks)
len(fit.history["loss"])
"""


def test_in_lock_step_keras_training_the_rank_the_others_wait_for_is_named(tmp_path):
    """Keras ranks wait inside the graph, in Horovod's allreduce op: the gradients' allreduce
    (``hvd.DistributedOptimizer``) is timed there, by ``tf.timestamp`` ops around it."""
    named_in_lock_step(KERAS_LOCK_STEP, make_options(np=-2, stragglers="0.5/2"), tmp_path)


DDP_HOOKS = """import pickle, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_time
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
plain, hooked = DDP(torch.nn.Linear(8, 1)), DDP(torch.nn.Linear(8, 1))
calls = []
def halved(state, bucket):  # the user's own hook: the mean of the halves, doubled
    calls.append(bucket.index())
    bucket.buffer().div_(2 * dist.get_world_size())
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
hooked.register_comm_hook(None, halved)
with torch.no_grad():
    plain(torch.ones(1, 8))  # not a training forward: DDP's default stays
before = collective_time.waited()
for model in (hooked, plain):
    model(torch.full((2, 8), dist.get_rank() + 1.0)).sum().backward()
grads = [float(p.grad.sum()) for model in (plain, hooked) for p in model.parameters()]
names = [model._get_ddp_logging_data().get("comm_hook") for model in (plain, hooked)]
(before, collective_time.waited() is not None, len(calls), names, grads, len(pickle.dumps(plain)) > 0)
"""


def test_ddp_keeps_the_users_hook_and_pickles_as_before(tmp_path):
    """On the CPU the timing registers no communication hook: DDP's own allreduce and the
    user's hook run as without hvd_magic, timed from the first training forward on; the timed
    model pickles as DDP does."""
    options = make_options(np=-2, backend="torch")
    result, _ = run_on_ranks(pack_cell(DDP_HOOKS, {}), options, RecordingView())
    before, measured, calls, names, grads, pickles = result
    assert before is None and measured  # timed from the first training forward on
    assert calls == 1 and names == [None, "halved"]  # as DDP logs them without hvd_magic
    assert grads[:2] == pytest.approx(grads[2:])  # both averaged the ranks' gradients alike
    assert pickles


def test_ddp_is_timed_when_torch_is_imported_after_the_rank_started():
    """A rank asks for DDP's timing before the cell imports torch: it is in place once torch is."""
    script = (
        "import sys\n"
        "from hvd_magic.rank import collective_ddp\n"
        "collective_ddp.time_ddp()\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "print('timed', DistributedDataParallel._hvd_magic_timed)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "timed True" in done.stdout, done.stderr[-3000:]


DDP_SHAPES = """import threading, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from hvd_magic.rank import collective_ddp, collective_time
dist.init_process_group("gloo")
def late(state, bucket):  # the allreduce's result (one rank: the gradients) comes 0.2 s later
    result = torch.futures.Future()
    threading.Timer(0.2, result.set_result, (bucket.buffer(),)).start()
    return result
class Net(torch.nn.Module):
    def __init__(self, reentrant=False):
        super().__init__()
        self.a, self.b, self.reentrant = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1), reentrant
    def forward(self, x):
        h = checkpoint(self.a, x, use_reentrant=True) if self.reentrant else self.a(x)
        return self.b(torch.relu(h))
def steps(model, penalty=False):
    model.register_comm_hook(None, late)
    collective_ddp.time_model(model)
    for step in range(4):
        if step == 1:  # after the first (with static_graph, DDP waits before the backward's end)
            before = collective_time.waited()
        x = torch.randn(4, 8, requires_grad=True)
        out = model(x)
        loss = out.sum()
        if penalty:  # a gradient penalty: a backward of its own that accumulates nothing first
            (grad,) = torch.autograd.grad(loss, x, create_graph=True)
            loss = loss + grad.pow(2).sum()
        loss.backward()
    return round((collective_time.waited() - before) / 3, 2)
{
    "default": steps(DDP(Net())),
    "find_unused_parameters": steps(DDP(Net(), find_unused_parameters=True)),
    "static_graph": steps(DDP(Net(), static_graph=True)),
    "gradient penalty": steps(DDP(Net()), penalty=True),
    "reentrant checkpointing": steps(DDP(Net(reentrant=True), static_graph=True)),
}
"""


def test_ddps_wait_is_timed_whatever_the_shape_of_the_backward(tmp_path):
    """The wait at the end of backward (here 0.2 s a step: the allreduce's result comes late) is
    timed with DDP's options, a gradient penalty's extra backward before it, and reentrant
    checkpointing's nested backward (where DDP's wait then is); from the second step on (the
    first with ``static_graph`` waits earlier, in a callback of DDP's queued before)."""
    options = make_options(np=-1, backend="torch")
    result, _ = run_on_ranks(pack_cell(DDP_SHAPES, {}), options, RecordingView())
    assert all(0.18 <= waited <= 2.0 for waited in result.values()), result


DDP_REWRAPPED = """import gc, threading, weakref, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_time
dist.init_process_group("gloo")
def late(state, bucket):  # the allreduce's result comes 0.5 s later
    result = torch.futures.Future()
    threading.Timer(0.5, result.set_result, (bucket.buffer(),)).start()
    return result
net, x = torch.nn.Linear(8, 1), torch.randn(4, 8)
def wrapped():
    model = DDP(net)
    model.register_comm_hook(None, late)
    return model
first = wrapped()
first(x).sum().backward()
first(x)  # a forward whose backward never comes (the cell was stopped, or an evaluation)
gone = weakref.ref(first)
del first
gc.collect()
again = wrapped()  # the same module wrapped anew, as a cell run twice does
before = collective_time.waited()
again(x).sum().backward()  # its first step (timed from its first forward)
(gone() is None, round(collective_time.waited() - before, 2))
"""


def test_a_module_wrapped_anew_is_timed_once_a_step(tmp_path):
    """A DDP model that is gone takes its timing with it: the module wrapped again in a new DDP
    (a notebook's cell run twice) counts each step's wait once, even where the old wrapper's
    last forward had no backward."""
    options = make_options(np=-1, backend="torch")
    (freed, waited), _ = run_on_ranks(pack_cell(DDP_REWRAPPED, {}), options, RecordingView())
    assert freed  # else the test shows nothing
    assert 0.45 <= waited < 0.95, waited  # 0.5 s; counted twice (the old wrapper's too): 1.0


DDP_STEP = """import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_time
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(8, 1))
model(torch.ones(2, 8)).sum().backward()
(collective_time.waited(), model._get_ddp_logging_data().get("comm_hook"))
"""


def test_with_stragglers_off_a_rank_times_nothing(tmp_path):
    """Nothing judges the waits: nothing is added to the user's training (DDP keeps no hook)."""
    result, _ = run_on_ranks(
        pack_cell(DDP_STEP, {}), make_options(np=-2, backend="torch", stragglers="off"), RecordingView()
    )
    assert result == (None, None)
    timed, _ = run_on_ranks(pack_cell(DDP_STEP, {}), make_options(np=-2, backend="torch"), RecordingView())
    assert timed[0] is not None and timed[0] >= 0
