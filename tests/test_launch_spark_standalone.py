"""Multi-host: a real standalone master and two workers on different loopback addresses; an
estimator's fit that loses one of them for good and gets it back (``min_np``)."""

from __future__ import annotations

import threading
import time

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

    from hvd_magic.launch.spark_session import slots_available
    from hvd_magic.spark import TorchEstimator

    net = gated_net(tmp_path)
    estimator = TorchEstimator(
        num_proc=4, min_np=2, resize_wait=3, retries=2, model=net, loss=torch.nn.functional.cross_entropy,
        optimizer=torch.optim.Adam(net.parameters()), feature_cols=["image"], label_cols=["label"],
        batch_size=32, epochs=4, validation=0.0, model_dir=str(tmp_path / "run"),
    )  # fmt: skip

    def lose_the_host_then_bring_it_back() -> None:
        if not wait_for_files([tmp_path / "run" / "checkpoints" / checkpoint_name(1)], timeout=240):
            return
        cluster.lose_worker("127.0.0.3")
        (tmp_path / "lost").touch()
        if wait_for_files([tmp_path / "size-2-rank-0"], timeout=240):
            cluster.start_worker("127.0.0.3")
            deadline = time.monotonic() + 120
            while (slots_available(two_hosts) or 0) < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
        (tmp_path / "back").touch()

    actor = threading.Thread(target=lose_the_host_then_bring_it_back, daemon=True)
    actor.start()
    model = estimator.fit(mnist_frames(two_hosts)[0].limit(800))
    actor.join(timeout=60)
    shown = capsys.readouterr()
    assert "4 → 2 ranks: executor or host lost" in shown.err and "from epoch 1" in shown.err, shown.err
    assert "2 → 4 ranks: the cluster has the slots again, from epoch 2" in shown.err, shown.err
    assert len(model.history) == 4
    steps = [step for step, _ in event_scalars(tmp_path / "run" / "logs")["loss"]]
    assert steps == [7, 26, 21, 28]  # epoch 1 on 4 ranks, 2 on 2 (all 800 rows), 3 and 4 on 4
    assert run_processes_anywhere() == []
