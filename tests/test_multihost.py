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


HOSTS_OF = {
    "gloo": "%%horovod np=3 launcher=gloo\nimport socket, horovod.torch as hvd\nhvd.init()\n"
    "sorted(hvd.allgather_object(socket.gethostname()))",
    "torch": "%%horovod np=3 backend=torch\nimport socket, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\nnames = [None] * 3\n"
    "dist.all_gather_object(names, socket.gethostname())\nsorted(names)",
}


@pytest.mark.parametrize("kind", ["gloo", "torch"])
def test_gloo_and_torch_ranks_run_on_the_three_hosts(multihost: Cluster, kind: str) -> None:
    kernel = multihost.kernel
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    outcome = kernel.run(HOSTS_OF[kind], timeout=180)
    assert outcome.value == "['hostA', 'hostB', 'hostC']", f"{outcome.ename}: {outcome.evalue}"


def test_the_timeline_is_written_on_rank_0s_host_and_arrives_whole_on_the_notebooks(
    multihost: Cluster,
) -> None:
    kernel = multihost.kernel
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    cell = "%%horovod np=3 timeline=bed_timeline.json\nimport horovod.torch as hvd, torch\nhvd.init()\n"
    cell += "for _ in range(20):\n    hvd.allreduce(torch.ones(1000))\n"
    assert kernel.run(cell, timeout=180).status == "ok"
    whole = kernel.run("import json, os\nlen(json.load(open('bed_timeline.json'))), os.getcwd()")
    count, folder = ast.literal_eval(whole.value)
    assert count > 60  # strict JSON, every allreduce's events
    for host in ("hostA", "hostB", "hostC"):  # not in any rank host's working folder
        assert multihost.bed.run(host, ["test", "-e", f"{folder}/bed_timeline.json"]).returncode == 1


def test_a_live_session_spans_the_three_hosts(multihost: Cluster) -> None:
    kernel = multihost.kernel
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    started = kernel.run("%horovod start np=3", timeout=180)
    assert any("3 ranks on 3 hosts (hostA, hostB, hostC)" in text for text in started.shown), started
    try:
        assert kernel.run("%%horovod\nimport socket\nme = socket.gethostname()").status == "ok"
        names = kernel.run("%%horovod\nsorted(hvd.allgather_object(me))")
        assert names.value == "['hostA', 'hostB', 'hostC']", names
    finally:
        assert kernel.run("%horovod stop").status == "ok"
