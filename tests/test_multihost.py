"""The multi-host bed (``tests.multihost``): a notebook on its own host runs a cell on three
other hosts, each with its own name, address and disk."""

from __future__ import annotations

import ast
import uuid

import pytest

from .multihost import Cluster

pytestmark = pytest.mark.multihost

WHERE_AM_I = """%%horovod np=3
import json, socket, psutil, horovod.torch as hvd
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
[json.loads(s) for s in hvd.allgather_object(json.dumps(me))]
"""


def test_a_cell_runs_on_three_hosts_with_their_own_names_addresses_and_disks(multihost: Cluster) -> None:
    kernel = multihost.kernel
    assert kernel is not None
    probe = f"/tmp/hvd_magic-bed-probe-{uuid.uuid4().hex[:8]}"
    assert kernel.run("%load_ext hvd_magic").status == "ok"
    outcome = kernel.run(WHERE_AM_I.format(probe=probe), timeout=120)
    assert outcome.status == "ok", f"{outcome.ename}: {outcome.evalue}\n{''.join(outcome.shown)[-3000:]}"
    ranks = sorted(ast.literal_eval(outcome.value), key=lambda rank: rank["rank"])
    assert sorted(rank["host"] for rank in ranks) == ["hostA", "hostB", "hostC"]
    for rank in ranks:  # each rank sees exactly its host's bed address, and its name resolves to it
        assert rank["ips"] == [multihost.ip(rank["host"])], rank
        assert rank["resolved"] == multihost.ip(rank["host"]), rank
    rank0_host = ranks[0]["host"]
    assert multihost.bed.run(rank0_host, ["cat", probe]).stdout == "written by rank 0"
    for host in {"hostA", "hostB", "hostC", "hostD"} - {rank0_host}:  # /tmp is each host's own
        assert multihost.bed.run(host, ["test", "-e", probe]).returncode == 1, host
    on_the_notebook = kernel.run(f"import os\nos.path.exists({probe!r})")
    assert on_the_notebook.value == "False"
    multihost.bed.run(rank0_host, ["rm", probe])  # a bed brought up by hand outlives the test
