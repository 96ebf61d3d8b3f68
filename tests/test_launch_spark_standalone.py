"""Multi-host: a real standalone master and two workers on different loopback addresses."""

from __future__ import annotations

import pytest

from .helpers import leftover_processes
from .spark_fixtures import spark_session, standalone_cluster

CELL = """
import json, os, horovod.torch as hvd, torch
hvd.init()
me = {"ip": os.environ.get("SPARK_LOCAL_IP"), "host": os.environ.get("HVD_MAGIC_VIA_AGENT"),
      "cross_rank": hvd.cross_rank(),
      "sum": hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()}
[json.loads(s) for s in hvd.allgather_object(json.dumps(me))]
"""


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    logs = tmp_path_factory.mktemp("standalone")
    with standalone_cluster(["127.0.0.2", "127.0.0.3"], cores=2, log_dir=logs) as master:
        conf = {"spark.executor.cores": "2", "spark.cores.max": "4", "spark.executor.memory": "1g"}
        with spark_session(master, conf) as session:
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
