"""TorchDistributor: Spark's class on this engine, used as Spark's documentation uses it: a
training function (DDP on a small model) and a script with argparse arguments, on local
processes and on a real Spark session's executors (with fake GPUs: one a task)."""

from __future__ import annotations

import json
import textwrap
from collections import defaultdict

import pytest

from hvd_magic import CaptureError, LaunchError, RankFailedError, TorchDistributor
from hvd_magic.launch.spark_session import check_slots
from hvd_magic.notebook.distributor import check_task_gpus, local_gpu_processes, ssl_notes
from hvd_magic.run.history import HISTORY

from .helpers import leftover_processes
from .panel_helpers import served
from .spark_fixtures import TWO_EXECUTORS_FOUR_GPUS, gpu_conf, shared_spark_session

ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def train(learning_rate, steps=1):
    """The shape of Spark's TorchDistributor examples: init, DDP, train, return something."""
    import os

    import psutil
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())  # different starting weights: DDP makes them rank 0's
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()  # different data on each rank
        optimizer.step()
    me = {
        "rank": dist.get_rank(),
        "arguments": [learning_rate, steps],
        "params": [p.detach().flatten().tolist() for p in model.parameters()],
        "env": {name: os.environ.get(name) for name in ENV_NAMES},
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    executor = psutil.Process()  # on Spark: the executor JVM above this rank (None locally)
    while executor is not None and "CoarseGrainedExecutorBackend" not in " ".join(executor.cmdline()):
        executor = executor.parent()
    me["executor"] = executor.pid if executor is not None else None
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    dist.destroy_process_group()
    return {"returned_by": me["rank"], "ranks": everyone}


SCRIPT = """
import argparse, json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from helper import OUTPUT_NAME   # beside the script: its folder is first on sys.path

ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    record = {
        "argv": sys.argv, "name": __name__, "file": __file__, "learning_rate": args.learning_rate,
        "env": {n: os.environ.get(n) for n in ENV_NAMES},
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "params": [p.detach().flatten().tolist() for p in model.parameters()],
    }
    path = os.path.join(args.out, OUTPUT_NAME.format(dist.get_rank()))
    with open(path, "w") as file:
        json.dump(record, file)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


@pytest.fixture
def script(tmp_path):
    """A training script with argparse arguments, and a module beside it that it imports."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "helper.py").write_text('OUTPUT_NAME = "rank-{}.json"\n')
    path = folder / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


def script_records(folder, ranks):
    return [json.loads((folder / f"rank-{rank}.json").read_text()) for rank in range(ranks)]


def listed(tmp_path, launcher):
    """The kernel's newest run as the Horovod panel lists it: ended, finished, its launcher."""
    with served(tmp_path) as panel:
        row = panel.row(HISTORY.count)
    assert (row["launcher"], row["state"], row["outcome"]) == (launcher, "ended", "finished")
    assert row["has_value"]
    return row


def test_a_function_on_local_processes_returns_rank_0s_value(tmp_path):
    result = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train, 0.5, steps=2)
    assert result["returned_by"] == 0
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["arguments"] == [0.5, 2] for r in ranks)  # *args and **kwargs reach every rank
    assert ranks[0]["params"] == ranks[1]["params"]  # DDP averaged the gradients
    for rank in ranks:
        env = rank["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank["rank"]),) * 2 + ("2",)
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == ranks[0]["env"]["MASTER_PORT"]
    assert listed(tmp_path, "local · torch.distributed")["value"].endswith("'returned_by': 0}")
    assert leftover_processes() == []


def test_a_script_runs_as_torchrun_runs_it(script, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    arguments = ["--learning-rate", 0.25, f"--out={out}"]
    assert TorchDistributor(2, True, False).run(str(script), *arguments) is None  # Spark's: None
    records = script_records(out, 2)
    for rank, record in enumerate(records):
        assert record["argv"] == [str(script), "--learning-rate", "0.25", f"--out={out}"]
        assert record["name"] == "__main__" and record["file"] == str(script)
        assert record["learning_rate"] == 0.25
        assert record["env"]["RANK"] == record["env"]["LOCAL_RANK"] == str(rank)
        assert record["env"]["WORLD_SIZE"] == "2" and record["env"]["MASTER_PORT"]
    assert records[0]["params"] == records[1]["params"]
    assert leftover_processes() == []


def failing_on_rank_1():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank 1")
    dist.barrier()


def test_a_failing_rank_is_named():
    with pytest.raises(RankFailedError) as info:
        TorchDistributor(num_processes=2, use_gpu=False).run(failing_on_rank_1)
    assert info.value.rank == 1 and info.value.exc_type == "ValueError"
    assert str(info.value).startswith("rank 1") and "bad batch on rank 1" in str(info.value)
    first = info.value.remote_traceback.split("\n", 2)[1]  # the user's frame, not run_train_function's
    assert "failing_on_rank_1" in first and "run_train_function" not in info.value.remote_traceback
    assert leftover_processes() == []


def test_use_gpu_is_on_by_default_and_refused_without_a_gpu_as_in_spark():
    with pytest.raises(LaunchError, match="pass use_gpu=False"):
        TorchDistributor(num_processes=2)  # this machine has no GPU
    assert local_gpu_processes(2, 4) == (2, [])
    processes, notes = local_gpu_processes(3, 2)  # Spark's rule: cut to the GPUs, said
    assert processes == 2 and "num_processes=3" in notes[0]
    for amount in (None, "0"):
        with pytest.raises(LaunchError, match="spark.task.resource.gpu.amount"):
            check_task_gpus(amount)
    with pytest.raises(LaunchError, match="every process is a task of its own"):
        check_task_gpus("2")
    check_task_gpus("1")


def test_bad_arguments_are_hvd_magic_errors_that_say_what_to_do(script):
    with pytest.raises(LaunchError, match="positive whole number"):
        TorchDistributor(num_processes=0, use_gpu=False)
    with pytest.raises(LaunchError, match="would start 1,000 processes"):
        TorchDistributor(num_processes=1000, use_gpu=False).run(train, 0.1)
    distributor = TorchDistributor(num_processes=2, use_gpu=False)
    with pytest.raises(CaptureError, match="keyword arguments \\(lr\\) are for functions"):
        distributor.run(str(script), lr=0.1)
    with pytest.raises(CaptureError, match="does not exist on this machine"):
        distributor.run(str(script.parent / "missing.py"))
    with pytest.raises(CaptureError, match="a training function or the path"):
        distributor.run(42)
    assert leftover_processes() == []


def test_tls_clusters_are_refused_unless_allowed_as_in_spark():
    assert ssl_notes(None, None, "pytorch.spark.distributor.ignoreSsl") == []
    with pytest.raises(LaunchError, match="set pytorch.spark.distributor.ignoreSsl=true"):
        ssl_notes("true", None, "pytorch.spark.distributor.ignoreSsl")
    (note,) = ssl_notes("true", "true", "my.allow")
    assert "not encrypted" in note
    assert ssl_notes("true", "true", "my.allow") == []  # said once


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """The launch tests' cluster, shared: two executors with two (fake) GPUs and two slots each,
    a GPU a task."""
    conf = gpu_conf(tmp_path_factory.getbasetemp() / "gpus")
    with shared_spark_session(TWO_EXECUTORS_FOUR_GPUS, conf) as session:
        check_slots(session, 4, wait=60)  # the executors register after the session starts
        yield session


def test_on_spark_each_process_is_a_task_with_its_gpu(spark, tmp_path):
    result = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True).run(train, 0.5)
    ranks = result["ranks"]
    assert result["returned_by"] == 0 and [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(rank["params"] == ranks[0]["params"] for rank in ranks)
    gpus = defaultdict(list)  # by executor: each of its two tasks has its own GPU
    for rank in ranks:
        gpus[rank["executor"]].append(rank["gpus"])
    assert None not in gpus and sorted(sorted(given) for given in gpus.values()) == [["0", "1"], ["0", "1"]]
    for rank in ranks:  # two on each executor, yet each is its own node, as under Spark's
        assert (rank["env"]["LOCAL_RANK"], rank["env"]["LOCAL_WORLD_SIZE"]) == ("0", "1")
        assert rank["env"]["RANK"] == str(rank["rank"]) and rank["env"]["WORLD_SIZE"] == "4"
    row = listed(tmp_path, "Spark local-cluster[2,2,1024] · torch.distributed")
    assert row["where"] == "4 ranks on Spark" and row["value"].endswith("'returned_by': 0}")
    assert leftover_processes() == []


def test_on_spark_a_script_runs_without_gpus_when_use_gpu_is_false(spark, script, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    TorchDistributor(2, local_mode=False, use_gpu=False).run(str(script), f"--out={out}")
    records = script_records(out, 2)
    assert all(r["gpus"] == "" for r in records)  # hidden, as Spark's sets it
    assert [r["argv"][1:] for r in records] == [[f"--out={out}"]] * 2 and records[0]["name"] == "__main__"
    assert records[0]["params"] == records[1]["params"]
    assert leftover_processes() == []
