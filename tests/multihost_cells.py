"""The cells the multi-host tests run in the bed's notebook kernel (``tests.test_multihost``)."""

WHERE_AM_I = """%%horovod np=3
import json, os, socket, psutil, horovod.torch as hvd
hvd.init()
if hvd.rank() == 0:
    open({probe!r}, "w").write("written by rank 0")
me = {{
    "rank": hvd.rank(),
    "host": socket.gethostname(),
    "ips": sorted(a.address for name, addresses in psutil.net_if_addrs().items() if name != "lo"
                  for a in addresses if a.family == socket.AF_INET),
    "resolved": socket.gethostbyname(socket.gethostname()),
}}
def this_runs_mpirun(process):  # the hosts share no pid namespace: rank 0 sees mpirun's /proc
    try:  # the run's mpirun: on this host (its network namespace), started by a Spark task
        return (os.path.basename(process.cmdline()[0]) == "mpirun"
                and os.readlink(f"/proc/{{process.pid}}/ns/net") == os.readlink("/proc/self/ns/net")
                and "HVD_MAGIC_AGENTS" in process.environ())
    except (psutil.Error, OSError, IndexError):
        return False
mpirun = [[p.cmdline(), json.loads(p.environ()["HVD_MAGIC_AGENTS"])]
          for p in psutil.process_iter() if hvd.rank() == 0 and this_runs_mpirun(p)]
[json.loads(s) for s in hvd.allgather_object(json.dumps(me))], mpirun
"""


TORCH_HOSTS = """%%horovod np=3 backend=torch
import socket, torch.distributed as dist
dist.init_process_group('gloo')
names = [None] * 3
dist.all_gather_object(names, socket.gethostname())
sorted(names)
"""


# Gloo ranks, each reading its shard of data= from the file its own host's task wrote.
GLOO_SHARDS = """%%horovod np=3 launcher=gloo data=bed_df
import os, socket, horovod.torch as hvd, hvd_magic
hvd.init()
table = hvd_magic.shard("arrow")
writer = (table.schema.metadata or {}).get(b"hvd_magic.executor", b"").decode()
me = [socket.gethostname(), table.column("id").to_pylist(), writer, os.environ["HVD_MAGIC_SHARD"]]
sorted(hvd.allgather_object(me))
"""


# Rank 2 late to every allreduce; each negotiation names its last rank (no response cache).
SLOW_RANK_2 = """%%horovod np=3 timeline=bed_timeline.json env=HOROVOD_CACHE_CAPACITY=0
import os, socket, time, horovod.torch as hvd, torch
hvd.init()
for step in range(15):
    if hvd.rank() == 2:  # later than a loaded machine's other ranks ever are, by a wide margin
        time.sleep(0.2)
    hvd.allreduce(torch.ones(1000), name=f"step{step}")
hvd.allgather_object([hvd.rank(), os.path.exists(os.environ["HOROVOD_TIMELINE"]), socket.gethostname()])
"""


KEEPS_RUNNING = """%%horovod np=3
import socket, time, horovod.torch as hvd, torch
hvd.init()
hvd.allreduce(torch.ones(1))
open(f"/tmp/hvd_magic-bed-rank-{hvd.rank()}", "w").write(socket.gethostname())
deadline = time.monotonic() + 150
while time.monotonic() < deadline:  # until a host dies under it
    hvd.allreduce(torch.ones(10))
    time.sleep(0.05)
"""


# Two fits of a TorchEstimator (1 epoch, then 2 from the first's checkpoint) on 3 executors,
# model_dir on the notebook's host only; the second model's predictions on the executors and
# here on the notebook's host, by the same network.
ESTIMATOR_FITS = """
import os, numpy as np, pandas as pd, torch
from sklearn.datasets import load_digits
from pyspark.ml.feature import VectorAssembler
from hvd_magic.spark import TorchEstimator
digits = load_digits()
columns = [f"p{{i}}" for i in range(64)]
frame = pd.DataFrame(digits.data[:600] / 16.0, columns=columns).assign(label=digits.target[:600])
df = VectorAssembler(inputCols=columns, outputCol="features").transform(spark.createDataFrame(frame))

def estimator(epochs):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    return TorchEstimator(
        num_proc=3, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-2),
        loss=torch.nn.functional.cross_entropy, feature_cols=["features"], label_cols=["label"],
        batch_size=32, epochs=epochs, validation=0.0, verbose=0, model_dir={model_dir!r},
    )

first = estimator(1).fit(df)
after_first = sorted(os.listdir({model_dir!r} + "/checkpoints"))
second = estimator(2).fit(df)
rows = second.transform(df.limit(50)).select("features", "prediction").collect()
features = torch.tensor(np.array([r.features.toArray() for r in rows]), dtype=torch.float32)
with torch.no_grad():
    here = second.getModel()(features)
[after_first, sorted(os.listdir({model_dir!r} + "/checkpoints")), os.path.isdir({model_dir!r} + "/model"),
 first.history[0] == second.history[0], len(second.history),
 [float(r.prediction) for r in rows] == [float(i) for i in here.argmax(1).tolist()]]
"""


# 60 steps, a checkpoint every 5 into checkpoint_dir on the notebook's host, resumed from on a
# retry; each rank marks its host with the step it started from.
RESUMES = """%%horovod np=3 retries=1 checkpoint_dir={store}
import socket, time, horovod.torch as hvd, torch, hvd_magic
hvd.init()
state = hvd_magic.resume() or {{"step": 0, "w": torch.zeros(1)}}
w = state["w"]
open(f"/tmp/hvd_magic-bed-rank-{{hvd.rank()}}", "w").write(str(state["step"]))
for step in range(state["step"], 60):
    w = w + hvd.allreduce(torch.ones(1), op=hvd.Sum)
    if step % 5 == 4:
        hvd_magic.checkpoint({{"step": step + 1, "w": w}}, step=step + 1)
    hvd_magic.report(step=step + 1, total=60)
    time.sleep(0.1)
[w.item(), state["step"], sorted(hvd.allgather_object(socket.gethostname()))]
"""

# min_np=2 of 3: the smaller attempt waits at its 8th step until the test has the lost host's
# worker back (GATE on every host), so that it grows back to 3 at a checkpoint after that.
GATE = "/tmp/hvd_magic-bed-go"
ELASTIC = """%%horovod np=3 retries=3 min_np=2 resize_wait=5 checkpoint_dir={store}
import os, socket, time, horovod.torch as hvd, torch, hvd_magic
hvd.init()
state = hvd_magic.resume() or {{"step": 0, "w": torch.zeros(1), "sizes": []}}
w, start = state["w"], state["step"]
sizes = state["sizes"] + [[start, hvd.size(), hvd_magic.resized()]]
open(f"/tmp/hvd_magic-bed-rank-{{hvd.rank()}}", "w").write(str(start))
for step in range(start, 120):
    w = w + hvd.allreduce(torch.ones(1), op=hvd.Average)  # one a step, whatever the size
    if step % 5 == 4:
        hvd_magic.checkpoint({{"step": step + 1, "w": w, "sizes": sizes}}, step=step + 1)
    hvd_magic.report(step=step + 1, total=120)
    while hvd.size() == 2 and step == start + 7 and not os.path.exists({gate!r}):
        time.sleep(0.1)
    time.sleep(0.1)
[w.item(), sizes, sorted(hvd.allgather_object(socket.gethostname()))]
"""

# A preemption notice (a worker decommissioned): the first attempt runs until the ranks are asked to
# stop, checkpoints there, and the next attempt runs 20 steps more from it.
PREEMPTED = """%%horovod np=3 retries=2 min_np=2 resize_wait=5 checkpoint_dir={store}
import time, horovod.torch as hvd, torch, hvd_magic
hvd.init()
state = hvd_magic.resume() or {{"step": 0, "w": torch.zeros(1), "starts": []}}
w, starts = state["w"], state["starts"] + [(state["step"], hvd.size())]
open(f"/tmp/hvd_magic-bed-rank-{{hvd.rank()}}", "w").write(str(state["step"]))
end = state["step"] + 20 if state["step"] else 3000
for step in range(state["step"], end):
    w = w + hvd.allreduce(torch.ones(1), op=hvd.Average)
    hvd_magic.report(step=step + 1, total=end)
    if hvd_magic.stopping():
        hvd_magic.checkpoint({{"step": step + 1, "w": w, "starts": starts}}, step=step + 1, wait=True)
        break
    time.sleep(0.05)
[w.item(), starts]
"""

# Rank 1 in a C call that holds Python's lock (libc's sleep through ctypes.PyDLL) at the timeout:
# every rank reports once all are past init, and rank 1 is in its C call 20 s later. The silence
# counts from the ranks' start too, so 20 s also leaves a loaded machine time to import torch
# (with timeout=5, three ranks importing it at once were still in the import when it ended).
HOLDS_THE_LOCK = """%%horovod np=3 timeout=20
import ctypes, time, horovod.torch as hvd, torch, hvd_magic
hvd.init()
hvd.allreduce(torch.ones(1))
hvd_magic.report(step=1)
if hvd.rank() == 1: ctypes.PyDLL(None).sleep(90)
time.sleep(90)
"""
