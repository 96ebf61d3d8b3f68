"""backend=torch: torch.distributed (DDP) ranks behind the same magic, on this machine; the
Spark side is in test_launch_spark.py. The environment, a DDP step, a named failure, an
interrupt that leaves nothing, and the options."""

from __future__ import annotations

import os
import signal
import time

import pytest
from IPython.core.error import UsageError

from hvd_magic import HorovodRunner, RankFailedError, RunInterrupted
from hvd_magic.options import OptionError, make_options

from .helpers import leftover_processes, wait_for_ranks, when_started

DDP_CELL = """
ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
import errno, os, socket, torch, torch.distributed as dist
def taken(address):                            # another process wanting rank 0's store's port
    with socket.socket() as other:
        try:
            other.bind((address, int(os.environ["MASTER_PORT"])))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
        return False
other_address = "127.0.0.2" if os.environ["MASTER_ADDR"] != "127.0.0.2" else "127.0.0.3"
port_held = taken(os.environ["MASTER_ADDR"]) and taken(other_address)   # torch binds every address
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())             # different starting weights: DDP makes them rank 0's
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(8, 4)).pow(2).mean().backward()   # different data on each rank
optimizer.step()
me = {
    "rank": dist.get_rank(), "size": dist.get_world_size(),
    "params": [p.detach().flatten().tolist() for p in model.parameters()],
    "env": {name: os.environ.get(name) for name in ENV_NAMES},
    "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(), "port_held": port_held,
}
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, me)
dist.destroy_process_group()
everyone
"""


def test_ddp_ranks_on_this_machine_get_torchruns_environment_and_agree(ip):
    ranks = ip.run_cell_magic("horovod", "np=-2 backend=torch", DDP_CELL)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["size"] for r in ranks} == {2}
    assert ranks[0]["params"] == ranks[1]["params"]  # one averaged step from the same weights
    for rank in ranks:
        env = rank["env"]
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank["rank"]),) * 2
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["MASTER_ADDR"]) == ("2", "2", "127.0.0.1")
    assert ranks[0]["env"]["MASTER_PORT"] == ranks[1]["env"]["MASTER_PORT"]
    assert ranks[0]["port_held"]  # held for rank 0's store before it listened: no other process got it
    assert leftover_processes() == []


def failing_last_rank():
    """torch.distributed ranks of which the last raises 'bad batch on rank N' (nested: pickled
    by value, as a notebook function would be)."""

    def main() -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == dist.get_world_size() - 1:
            raise ValueError(f"bad batch on rank {dist.get_rank()}")
        dist.barrier()

    return main


def test_a_failing_torch_rank_is_named():
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=-2, backend="torch").run(failing_last_rank())
    assert info.value.rank == 1 and "bad batch on rank 1" in str(info.value)
    assert leftover_processes() == []


def allreducing_cell(folder) -> str:
    """torch ranks that say they started (a file each in ``folder``), then allreduce forever."""
    return (
        "import pathlib, time, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
        f"pathlib.Path({str(folder)!r}, f'started-{{dist.get_rank()}}').touch()\n"
        "while True:\n    dist.all_reduce(torch.ones(1))\n    time.sleep(0.1)\n"
    )


def test_interrupt_stops_torch_ranks(ip, tmp_path):
    when_started(tmp_path, 2, lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(RunInterrupted):
        ip.run_cell_magic("horovod", "np=-2 backend=torch", allreducing_cell(tmp_path))
    assert wait_for_ranks(tmp_path, 2, timeout=1)
    assert leftover_processes() == []  # at once
    started = time.monotonic()
    assert ip.run_cell_magic("horovod", "np=-2 backend=torch", "import os\nos.environ['RANK']") == "0"
    assert time.monotonic() - started < 120


def test_backend_options():
    assert make_options(np=-2, backend="torch").launcher == "torch"
    assert make_options(np=-2, launcher="gloo", backend="horovod").launcher == "gloo"
    with pytest.raises(OptionError, match="drop launcher="):
        make_options(np=-2, launcher="mpi", backend="torch")
    with pytest.raises(OptionError, match="backend must be horovod or torch"):
        make_options(np=-2, backend="jax")


def test_backend_on_the_magic_line(ip):
    with pytest.raises(UsageError, match="invalid choice"):
        ip.run_cell_magic("horovod", "np=-2 backend=jax", "1")
