"""Multi-host: a real standalone master and two workers on different loopback addresses; an
estimator's fit that loses one of them for good and gets it back (``min_np``)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from hvd_magic.protocol.files import checkpoint_name

from .estimator_fixtures import mnist_frames, mnist_net
from .estimator_records import event_scalars
from .helpers import leftover_processes, run_processes_anywhere, wait_for_files
from .spark_fixtures import Standalone, spark_session, standalone_cluster

CELL = """
import json, os, horovod.torch as hvd, torch
hvd.init()
me = {"ip": os.environ.get("SPARK_LOCAL_IP"), "host": os.environ.get("HVD_MAGIC_VIA_AGENT"),
      "cross_rank": hvd.cross_rank(),
      "sum": hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()}
[json.loads(s) for s in hvd.allgather_object(json.dumps(me))]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("standalone")
    with standalone_cluster(["127.0.0.2", "127.0.0.3"], cores=2, log_dir=logs) as bed:
        yield bed


@pytest.fixture(scope="module")
def two_hosts(cluster):
    conf = {"spark.executor.cores": "2", "spark.cores.max": "4", "spark.executor.memory": "1g"}
    with spark_session(cluster.url, conf) as session:
        from hvd_magic.launch.spark import check_slots

        check_slots(session, 4, wait=60)
        yield session


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_ranks_run_on_both_hosts(ip, two_hosts, launcher):
    ranks = ip.run_cell_magic("horovod", f"np=4 launcher={launcher}", CELL)
    assert {r["sum"] for r in ranks} == {10.0}
    assert sorted(r["ip"] for r in ranks) == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert sorted({r["cross_rank"] for r in ranks}) == [0, 1]
    if launcher == "mpi":  # remote ranks were started through the exec agents, not ssh
        assert all(r["host"] and r["host"].startswith("hvd-host-") for r in ranks)
    assert leftover_processes() == []


def lose_a_host_then_bring_it_back(
    cluster: Standalone, session, after: Path, marks: Path
) -> threading.Thread:
    """In a thread: once ``after`` (a checkpoint) is there, the worker on 127.0.0.3 is killed for
    good with all under it and ``marks/lost`` written; once the smaller attempt's rank 0 wrote
    ``marks/size-2-rank-0``, the worker starts again, and ``marks/back`` is written when Spark has
    the 4 slots again."""
    from hvd_magic.launch.spark_session import slots_available

    def act() -> None:
        if not wait_for_files([after], timeout=240):
            return
        cluster.lose_worker("127.0.0.3")
        (marks / "lost").touch()
        if wait_for_files([marks / "size-2-rank-0"], timeout=240):
            cluster.start_worker("127.0.0.3")
            deadline = time.monotonic() + 120
            while (slots_available(session) or 0) < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
        (marks / "back").touch()

    actor = threading.Thread(target=act, daemon=True)
    actor.start()
    return actor


def gated_net(marks):
    """mnist_net whose ranks hold where the test acts, so that each change lands at a known epoch
    (800 rows, batches of 32: 7 steps an epoch on 4 ranks, 13 on 2): on 4 ranks, the first batch
    of epoch 2 waits for epoch 1's checkpoint and then for ``marks/lost``; on 2 ranks, the first
    batch waits for ``marks/back`` and the first of epoch 3 holds until the run stops it."""
    import torch

    class Gated(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net, self.batches = net, 0

        def forward(self, x):
            import time

            import horovod.torch as hvd

            if self.training:
                self.batches += 1
                size, gates = hvd.size(), []
                (marks / f"size-{size}-rank-{hvd.rank()}").touch()
                if size == 4 and self.batches == 8 and not (marks / "lost").exists():
                    gates = [marks / "run" / "checkpoints" / checkpoint_name(1), marks / "lost"]
                elif size == 2:
                    gates = {1: [marks / "back"], 14: [marks / "never"]}.get(self.batches, [])
                deadline = time.monotonic() + 120
                for gate in gates:
                    while not gate.exists() and time.monotonic() < deadline:
                        time.sleep(0.02)
            return self.net(x)

    return Gated(mnist_net())  # made here: the ranks cannot import this module's functions


def test_a_fit_goes_on_with_fewer_ranks_when_a_host_is_lost_and_grows_back_when_it_returns(
    cluster: Standalone, two_hosts, tmp_path, capsys
) -> None:
    """TorchEstimator(num_proc=4, min_np=2): the worker on 127.0.0.3 is killed for good in epoch 2,
    its two slots with it: after resize_wait the fit goes on with the 2 slots there are, from epoch
    1's checkpoint, its 800 rows split again for 2 ranks (13 steps an epoch, not 7); the worker
    comes back: at epoch 2's checkpoint the fit stops and starts again with 4, and finishes."""
    import torch

    from hvd_magic.spark import TorchEstimator

    net = gated_net(tmp_path)
    estimator = TorchEstimator(
        num_proc=4, min_np=2, resize_wait=3, retries=2, model=net, loss=torch.nn.functional.cross_entropy,
        optimizer=torch.optim.Adam(net.parameters()), feature_cols=["image"], label_cols=["label"],
        batch_size=32, epochs=4, validation=0.0, model_dir=str(tmp_path / "run"),
    )  # fmt: skip

    first = tmp_path / "run" / "checkpoints" / checkpoint_name(1)
    actor = lose_a_host_then_bring_it_back(cluster, two_hosts, first, tmp_path)
    model = estimator.fit(mnist_frames(two_hosts)[0].limit(800))
    actor.join(timeout=60)
    shown = capsys.readouterr()
    assert "4 → 2 ranks: executor or host lost" in shown.err and "from epoch 1" in shown.err, shown.err
    assert "2 → 4 ranks: the cluster has the slots again, from epoch 2" in shown.err, shown.err
    assert len(model.history) == 4
    steps = [step for step, _ in event_scalars(tmp_path / "run" / "logs")["loss"]]
    assert steps == [7, 26, 21, 28]  # epoch 1 on 4 ranks, 2 on 2 (all 800 rows), 3 and 4 on 4
    assert run_processes_anywhere() == []


def elastic_torch(marks: Path) -> tuple[float, list]:
    """torch.distributed on gloo, one all_reduce a step and a checkpoint every 5, holding where
    the test acts: on 4 ranks at step 12 until the step-10 checkpoint is kept and the host is
    lost; on 2, at its first step until the slots are back, and 6 steps on until the run stops it."""
    import time

    import torch
    import torch.distributed as dist

    import hvd_magic

    dist.init_process_group("gloo")
    size, rank = dist.get_world_size(), dist.get_rank()
    state = hvd_magic.resume() or {"step": 0, "w": 0.0, "sizes": []}
    start = state["step"]
    w, sizes = state["w"], [*state["sizes"], (start, size, hvd_magic.resized())]
    (marks / f"size-{size}-rank-{rank}").touch()
    gates = {(4, 12): ["lost"], (2, start): ["back"], (2, start + 6): ["never"]} if start < 15 else {}
    for step in range(start, 40):
        one = torch.ones(1)
        dist.all_reduce(one)
        w += one.item() / size  # 1 a step, whatever the size
        if step % 5 == 4:
            hvd_magic.checkpoint({"step": step + 1, "w": w, "sizes": sizes}, step=step + 1)
        deadline = time.monotonic() + 120
        for gate in gates.get((size, step), []):
            while not (marks / gate).exists() and time.monotonic() < deadline:
                time.sleep(0.02)
    return w, sizes


def test_a_torch_run_goes_on_with_fewer_ranks_when_a_host_is_lost_and_grows_back(
    cluster: Standalone, two_hosts, tmp_path, capsys
) -> None:
    """HorovodRunner(np=4, backend="torch", min_np=2): the host lost after the step-10
    checkpoint, the run goes on with world size 2 from it; the host back, it grows to 4 at the
    step-15 checkpoint and finishes, every step counted once."""
    from hvd_magic import HorovodRunner

    store = tmp_path / "store"
    actor = lose_a_host_then_bring_it_back(cluster, two_hosts, store / checkpoint_name(10), tmp_path)
    runner = HorovodRunner(
        np=4, backend="torch", retries=2, min_np=2, resize_wait=3, checkpoint_dir=str(store)
    )  # fmt: skip
    w, sizes = runner.run(elastic_torch, marks=tmp_path)
    actor.join(timeout=60)
    assert sizes == [(0, 4, None), (10, 2, (4, 2)), (15, 4, (2, 4))]
    assert w == 40.0  # every step once
    shown = capsys.readouterr().err
    lost = r"rank \d on \S+ was lost with executor \d+ on 127\.0\.0\.3 \(ranks \d, \d\)"  # the first cause
    assert re.search(rf"4 → 2 ranks: executor or host lost: {lost}: Spark lost the executor \(worker", shown)
    assert "2 → 4 ranks: the cluster has the slots again, from step 15" in shown, shown
    assert run_processes_anywhere() == []
