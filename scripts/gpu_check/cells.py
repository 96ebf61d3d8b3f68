"""The cells the checks run, as a user writes them. ``{device}`` is "cuda" on a GPU and "cpu" in the
dry-run, ``{nccl}`` the process group's backend there ("nccl" or "gloo")."""

from __future__ import annotations

# Horovod on the GPU: an allreduce of a CUDA tensor (NCCL), reported steps for the live view, and
# Horovod's synchronize timed by hvd_magic (the straggler watch's waits).
HOROVOD = """import time, torch, horovod.torch as hvd, hvd_magic
from hvd_magic.rank import collective_time
hvd.init()
device = torch.device("{device}", hvd.local_rank()) if "{device}" == "cuda" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
x = torch.full((4096,), float(hvd.rank() + 1), device=device)
for step in range(30):  # about 3 s: the ranks sample their resources about once a second
    y = hvd.allreduce(x, name="grad", op=hvd.Sum)
    hvd_magic.report(step=step + 1, total=30, loss=1.0 / (step + 1))
    time.sleep(0.1)
(str(y.device), float(y[0]), bool(hvd.nccl_built()), hvd.size(), collective_time.waited() is not None)
"""

# torch.distributed on the GPU through NCCL, one rank: where it runs and what the pinning left it.
TORCH = """import os, torch, torch.distributed as dist
dist.init_process_group("{nccl}")
local = int(os.environ["LOCAL_RANK"])
if "{device}" == "cuda":
    torch.cuda.set_device(local)
t = torch.full((8,), 2.0, device="{device}")
dist.all_reduce(t)
current = torch.cuda.current_device() if "{device}" == "cuda" else -1
(dist.get_backend(), str(t.device), float(t[0]), os.environ.get("CUDA_VISIBLE_DEVICES"), current)
"""

# Two ranks on the one GPU with Gloo (NCCL refuses two ranks on one device): each rank's view,
# and whether it was forked from a fork server (warm) that had not set up CUDA.
SHARED = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
if "{device}" == "cuda":
    torch.cuda.set_device(local % torch.cuda.device_count())
t = torch.full((8,), rank + 1.0, device="{device}")
dist.all_reduce(t)
current = torch.cuda.current_device() if "{device}" == "cuda" else -1
seen = [None] * dist.get_world_size()
forked = "hvd_magic.warm.fork_server" in open(f"/proc/{{os.getppid()}}/cmdline").read()  # a warm rank
mine = (rank, os.environ.get("CUDA_VISIBLE_DEVICES"), current, str(t.device), float(t[0]), forked)
dist.all_gather_object(seen, mine)
seen
"""


# TorchDistributor's local mode: one process a GPU, cuda:LOCAL_RANK its GPU.
def distributed_function(device: str, backend: str) -> tuple[str, str, float, str | None]:
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend)
    where = f"cuda:{os.environ['LOCAL_RANK']}" if device == "cuda" else "cpu"
    t = torch.ones(4, device=where)
    dist.all_reduce(t)
    return (dist.get_backend(), str(t.device), float(t[0]), os.environ.get("CUDA_VISIBLE_DEVICES"))


# A live session: the model is built in one cell and trained in the next; its CUDA state stays.
SESSION_BUILD = """import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
model = model.to("{device}")
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(512, 256, device="{device}")
target = data[:, :1].clone()
print("built on", next(model.parameters()).device)
"""
SESSION_TRAIN = """import time
losses = []
for step in range(200):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data), target)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
kept = torch.cuda.memory_allocated() if "{device}" == "cuda" else 0
time.sleep(2.5)  # a beat or two, so that the status has the GPU's figures
(str(next(model.parameters()).device), kept, losses[0], losses[-1])
"""

# DDP in lock-step, two ranks sharing the GPU (Gloo); rank 1's GPU is busy with extra work
# until the view names it, then it keeps pace; the run stops once it has caught up.
STRAGGLER = """import os, pathlib, time, torch, hvd_magic
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_time
dist.init_process_group("gloo")
rank = dist.get_rank()
if "{device}" == "cuda":
    torch.cuda.set_device(0)
model = DDP(torch.nn.Linear(64, 1).to("{device}"))
busy = torch.randn({size}, {size}, device="{device}")
switches = pathlib.Path({folder!r})
step, deadline = 0, time.time() + 150
while time.time() < deadline:
    if rank == 1 and not (switches / "recover").exists():
        for _ in range({repeat}):  # rank 1's GPU is busy: its step waits for the extra work
            busy = torch.tanh(busy @ busy)
    model(torch.randn(8, 64, device="{device}")).sum().backward()  # rank 0 waits here for rank 1
    done = torch.tensor([float((switches / "stop").exists())])
    dist.all_reduce(done)
    step += 1
    hvd_magic.report(step=step)
    if done.item() > 0:
        break
(step, collective_time.waited() is not None, next(model.parameters()).device.type)
"""

# A CUDA model checkpointed every 5 steps; the rank is killed at step 12 on its first attempt;
# retries=1 resumes it from step 10 with the model's state as it was there.
RETRY = """import os, pathlib, signal, torch, torch.distributed as dist, hvd_magic
dist.init_process_group("{nccl}")
torch.manual_seed(0)
model = torch.nn.Linear(16, 1).to("{device}")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
state = hvd_magic.resume()
start = 0
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
    pathlib.Path({marks!r}, f"resumed-{{start}}").touch()
x = torch.ones(4, 16, device="{device}")
for step in range(start, 20):
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    if step % 5 == 4:
        hvd_magic.checkpoint({{"step": step + 1, "model": model.state_dict(),
                              "optimizer": optimizer.state_dict()}}, step=step + 1, wait=True)
    hvd_magic.report(step=step + 1, total=20)
    if step == 12 and not pathlib.Path({marks!r}, "killed").exists():
        pathlib.Path({marks!r}, "killed").touch()
        os.kill(os.getpid(), signal.SIGKILL)
(str(next(model.parameters()).device), float(model.weight.sum()))
"""

# A Hugging Face Trainer as a user writes it, on a tiny BERT made from its config (nothing
# downloaded): accelerate sets up the process group (NCCL where there is a GPU), and hvd_magic's
# callback, added with no code in the cell, feeds the view. 512 rows at 32 a step: 16 steps an epoch.
HF_TRAINER = """import torch, torch.distributed as dist
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=128, max_position_embeddings=32)
class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 512
    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        mask = torch.ones(16, dtype=torch.long)
        return {{"input_ids": ids, "attention_mask": mask, "labels": int(ids[0] % 2)}}
args = TrainingArguments(output_dir={output!r}, per_device_train_batch_size=32, num_train_epochs=2,
                         report_to=[], use_cpu={cpu}, disable_tqdm=True, logging_steps=4, save_strategy="no")
trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Rows())
result = trainer.train()
added = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
device, wrapped = str(next(trainer.model.parameters()).device), type(trainer.model_wrapped).__name__
(dist.get_backend(), device, wrapped, trainer.args.world_size, result.global_step, added)
"""
