"""%%horovod on Spark Connect sessions, as Spark 4 and managed Spark hand them to notebooks.

Each runs in a real kernel: a local Connect server lives in the JVM of the process that starts
it, which cannot also hold this test process's classic sessions. Two servers: one in front of
``local[2]`` and one in front of ``local-cluster`` (two executor JVMs)."""

from __future__ import annotations

import ast
import re
import time

import pytest
from jupyter_client.manager import start_new_kernel

from .data_cells import answers_cell, rank_answers
from .helpers import run_processes_anywhere, wait_for_ranks, waiting_cell
from .kernels import NO_ABORT, Kernel, reply_to
from .panel_helpers import kernels_panel

MASTERS = ["local[2]", "local-cluster[2,1,1024]"]


def on_executors_only(request: pytest.FixtureRequest) -> None:
    """What a test checks of Connect does not change with the server's master: it runs against
    local-cluster only (executor JVMs, as a cluster has), which keeps the suite's time down.
    ``local[2]`` keeps an mpi run and an interrupt (once, a local[2] server hung after one)."""
    if request.node.callspec.params.get("connect") == "local[2]":
        pytest.skip("checked on local-cluster (the same Connect code path, with executor JVMs)")


@pytest.fixture(scope="module", params=MASTERS)
def connect(request, tmp_path_factory):
    """A kernel whose active session is a Spark Connect session to a local server."""
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path_factory.mktemp("connect")))
    kernel = Kernel(manager, client)
    try:
        started = kernel.run(
            "import os, sys\nos.environ['PYSPARK_PYTHON'] = sys.executable\n"
            "from pyspark.sql import SparkSession\n"
            f"spark = SparkSession.builder.remote({request.param!r}).config('spark.ui.enabled', 'false')"
            ".getOrCreate()\n%load_ext hvd_magic\n"
            "type(spark).__module__"
        )
        assert started.status == "ok" and "connect" in started.value, started
        yield kernel
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


ALLREDUCE = (
    "import horovod.torch as hvd, torch\nhvd.init()\n"
    "(hvd.rank(), hvd.size(), hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item())"
)


TORCH_ALLREDUCE = (
    "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
    "total = torch.tensor([dist.get_rank() + 1.0])\ndist.all_reduce(total)\n"
    "(dist.get_rank(), dist.get_world_size(), total.item())"
)


@pytest.mark.parametrize(
    ("options", "cell", "how"),
    [
        ("launcher=mpi", ALLREDUCE, "Horovod (mpirun)"),
        ("launcher=gloo", ALLREDUCE, "Horovod (Gloo)"),
        ("backend=torch", TORCH_ALLREDUCE, "torch.distributed"),
    ],
    ids=["mpi", "gloo", "torch"],
)
def test_allreduce_on_a_connect_session(connect, options, cell, how, request):
    expected = "(0, 2, 3.0)"  # rank 0's value is the cell's Out
    if options != "launcher=mpi":
        on_executors_only(request)
    else:  # and how mpirun reached the rank: itself on one executor (local[2]), else an agent
        cell = f"import os\n{cell} + (os.environ.get('HVD_MAGIC_VIA_AGENT', 'mpirun'),)"
        one_host = request.node.callspec.params["connect"] == "local[2]"
        expected = expected[:-1] + (", 'mpirun')" if one_host else ", 'hvd-host-0')")
    outcome = connect.run(f"%%horovod np=2 {options}\n{cell}")
    assert outcome.status == "ok", outcome
    assert outcome.value == expected, outcome
    # the run as the Horovod panel lists it, from the kernel's own endpoint: the Connect server's address
    row = kernels_panel(connect.manager).ask({"ask": "runs"})["runs"][-1]
    assert re.fullmatch(rf"Spark Connect sc://localhost:\d+ · {re.escape(how)}", row["launcher"]), row
    assert (row["state"], row["outcome"], row["value"]) == ("ended", "finished", expected)
    assert run_processes_anywhere() == []


def test_data_frame_shards_on_a_connect_session(connect, request, tmp_path):
    on_executors_only(request)
    assert connect.run("df = spark.range(0, 1001, 1, 3).selectExpr('id', 'id * 2.0 as x')").status == "ok"
    cell = "import json, os, pathlib, hvd_magic\n" + answers_cell(
        tmp_path, "hvd_magic.shard()['id'].tolist()"
    )
    outcome = connect.run("%%horovod np=2 data=df\n" + cell)
    assert outcome.status == "ok", outcome
    shards = [rank["answer"] for rank in rank_answers(tmp_path)]
    assert [len(s) for s in shards] == [500, 500]
    assert len(set(shards[0] + shards[1])) == 1000 and set(shards[0] + shards[1]) <= set(range(1001))
    assert "1,001 rows into 2 shards of 500 rows; dropped the last 1" in "".join(outcome.shown)


def test_a_parquet_scan_is_read_from_its_files_on_a_connect_session(connect, tmp_path, request):
    on_executors_only(request)
    folder = str(tmp_path / "table")
    written = connect.run(
        f"spark.range(0, 1001, 1, 3).selectExpr('id', 'id * 2.0 as x').write.parquet({folder!r})\n"
        f"pq_df = spark.read.parquet({folder!r})"
    )
    assert written.status == "ok", written
    answers = tmp_path / "answers"
    answers.mkdir()
    me = "[hvd_magic.shard()['id'].tolist(), os.environ['HVD_MAGIC_SHARD']]"
    cell = "import json, os, pathlib, hvd_magic\n" + answers_cell(answers, me)
    outcome = connect.run("%%horovod np=2 data=pq_df\n" + cell)
    assert outcome.status == "ok", outcome
    ranks = [rank["answer"] for rank in rank_answers(answers)]
    assert [len(ids) for ids, _ in ranks] == [500, 500]
    assert len(set(ranks[0][0] + ranks[1][0])) == 1000
    assert all(path.endswith(".pieces.json") for _, path in ranks)  # the files, not Spark's rows
    assert "straight from its Parquet files" in "".join(outcome.shown)
    # A choice of its columns, in another order, is read from the files too.
    assert connect.run(f"chosen = spark.read.parquet({folder!r}).select('x', 'id')").status == "ok"
    outcome = connect.run(
        "%%horovod np=2 data=chosen\nimport os, hvd_magic\n"
        "[list(hvd_magic.shard().columns), os.environ['HVD_MAGIC_SHARD'].endswith('.pieces.json')]"
    )
    assert outcome.status == "ok", outcome
    assert ast.literal_eval(outcome.value) == [["x", "id"], True]
    assert run_processes_anywhere() == []


def test_a_failing_rank_is_named_on_a_connect_session(connect, request):
    on_executors_only(request)
    cell = "import horovod.torch as hvd, torch\nhvd.init()\n"
    cell += "if hvd.rank() == 1:\n    raise ValueError('bad row')\n"
    outcome = connect.run("%%horovod np=2\n" + cell + "hvd.allreduce(torch.tensor([1.0]))")
    assert outcome.ename == "RankFailedError", outcome
    assert outcome.evalue.startswith("rank 1") and "ValueError: bad row" in outcome.evalue
    assert run_processes_anywhere() == []


def test_a_run_another_client_interrupts_is_named_cancelled_and_not_retried(connect, tmp_path, request):
    """Another Spark Connect client's ``interruptAll`` (here the notebook's own session, from a
    thread) cancels the run's operation: the error says so in Spark's word, and retries= does not
    start it again."""
    on_executors_only(request)
    connect.run(
        "import pathlib, threading, time\n"
        "def _interrupt_once_started():\n"
        f"    while len(list(pathlib.Path({str(tmp_path)!r}).glob('started-*'))) < 2:\n"
        "        time.sleep(0.1)\n"
        "    spark.interruptAll()\n"
        "threading.Thread(target=_interrupt_once_started, daemon=True).start()"
    )
    cell = (
        "import os, pathlib, time\n"
        f"pathlib.Path({str(tmp_path)!r}, 'started-' + os.environ['OMPI_COMM_WORLD_RANK']).touch()\n"
        "time.sleep(600)"
    )
    outcome = connect.run("%%horovod np=2 retries=1\n" + cell)
    assert outcome.ename == "RunError", outcome
    said = "the run was stopped: Spark cancelled the run's tasks (OPERATION_CANCELED: Operation has been"
    assert outcome.evalue.startswith(said), outcome
    shown = "".join(outcome.shown)
    assert "the run failed (cancelled in Spark)" in shown and "attempt 2" not in shown, outcome
    assert run_processes_anywhere() == []


TAG_RECORDER = """
from hvd_magic.launch.spark import SparkLauncher
launch_tags = []
_real_start = SparkLauncher.start
def _recording_start(self, hub, env):
    launch_tags.append(self.tag)
    _real_start(self, hub, env)
SparkLauncher.start = _recording_start
"""


def test_an_interrupt_stops_every_process_and_cancels_the_barrier_job_by_its_tag(connect, tmp_path):
    assert connect.run(TAG_RECORDER).status == "ok"
    try:
        msg_id = connect.client.execute("%%horovod np=2\n" + waiting_cell(tmp_path), stop_on_error=NO_ABORT)
        assert wait_for_ranks(tmp_path, 2)
        connect.manager.interrupt_kernel()
        reply = reply_to(connect.client, msg_id, 120)
        assert reply["content"]["ename"] == "RunInterrupted", reply["content"]
        # The server has no operation left under the run's tag: interrupting it again finds none.
        assert run_processes_anywhere() == []  # at once: the stop is complete when the cell returns
        left = connect.run("(len(launch_tags), spark.interruptTag(launch_tags[-1]))")
        assert left.value == "(1, [])", left
    finally:
        connect.run("SparkLauncher.start = _real_start")
    again = connect.run(f"%%horovod np=2\n{ALLREDUCE}")
    assert again.value == "(0, 2, 3.0)", again  # and the next run works


UNREACHABLE = """
import socket, time
from hvd_magic.launch.spark import SparkLauncher
with socket.socket() as _probe:
    _probe.bind(("127.0.0.1", 0))
    closed = _probe.getsockname()[1]
_real_start = SparkLauncher.start
def _behind_a_firewall(self, hub, env):  # the executors are told an address nobody listens on
    hub.address = f"tcp://127.0.0.1:{closed}"
    _real_start(self, hub, env)
SparkLauncher.start = _behind_a_firewall
"""


def test_executors_that_cannot_reach_the_notebook_fail_fast_on_a_connect_session(connect, request):
    on_executors_only(request)
    assert connect.run(UNREACHABLE).status == "ok"
    try:
        started = time.monotonic()
        outcome = connect.run("%%horovod np=2\n1")
        elapsed = time.monotonic() - started
        closed = connect.run("closed").value
        assert outcome.ename == "RunError", outcome
        assert f"cannot reach the notebook at 127.0.0.1:{closed}" in outcome.evalue, outcome
        assert "HVD_MAGIC_DRIVER_HOST" in outcome.evalue
        assert elapsed < 30, f"the executors' failure took {elapsed:.0f} s to reach the notebook"
        assert run_processes_anywhere() == []
    finally:
        connect.run("SparkLauncher.start = _real_start")


def test_more_ranks_than_slots_fails_fast_on_a_connect_session(connect, request):
    on_executors_only(request)
    started = time.monotonic()
    outcome = connect.run("%%horovod np=3\n1")
    assert outcome.ename == "LaunchError", outcome
    assert "np=3 needs 3 task slots at once, but the Spark cluster has 2" in outcome.evalue
    assert time.monotonic() - started < 60  # Spark would retry the barrier stage for 10 minutes


def test_a_live_session_on_a_connect_session(connect, request):
    on_executors_only(request)
    started = connect.run("%horovod start np=2")
    assert started.status == "ok" and any("live session: 2 ranks" in text for text in started.shown), started
    try:
        assert connect.run("%%horovod\nimport torch\nw = torch.tensor([hvd.rank() + 1.0])").status == "ok"
        assert connect.run("%%horovod\nw *= 10").status == "ok"
        total = connect.run("%%horovod\nhvd.allreduce(w, op=hvd.Sum).item()")
        assert total.value == "30.0", total
    finally:
        stopped = connect.run("%horovod stop")
    assert any("its 2 ranks ended" in text for text in stopped.shown), stopped
    assert run_processes_anywhere() == []
    again = connect.run(f"%%horovod np=2\n{ALLREDUCE}")
    assert again.value == "(0, 2, 3.0)", again  # the session's slots are free


ESTIMATOR = """
import pandas as pd, torch
from sklearn.datasets import load_digits
from hvd_magic.spark import TorchEstimator

digits = load_digits()
df = spark.createDataFrame(pd.DataFrame({"features": list(digits.data / 16.0), "label": digits.target}))
torch.manual_seed(0)
net = torch.nn.Linear(64, 10)
model = TorchEstimator(
    num_proc=2, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
    loss=torch.nn.functional.cross_entropy, feature_cols=["features"], label_cols=["label"],
    batch_size=32, epochs=4, verbose=0,
).fit(df)
round(model.transform(df).where("prediction = label").count() / df.count(), 3)
"""


def test_an_estimator_fits_and_transforms_on_a_connect_session(connect, request):
    on_executors_only(request)
    outcome = connect.run(ESTIMATOR)
    assert outcome.status == "ok", outcome
    assert float(outcome.value) >= 0.9
    assert run_processes_anywhere() == []
