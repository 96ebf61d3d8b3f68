"""Live sessions and long runs on a real local-cluster (two executor JVMs): a session's ranks
live in one barrier stage that stays up across cells, and stop frees the slots; a run that loses
an executor JVM starts again on the executor Spark brings back and resumes from its checkpoint.
And a notebook that goes silent (its kernel stopped) is left by its ranks on their own."""

from __future__ import annotations

import os
import signal

import pytest
from jupyter_client.manager import start_new_kernel

from hvd_magic.launch.spark_session import check_slots
from hvd_magic.session import commands as sessions

from .helpers import executor_processes, gone_within, is_rank, run_processes_anywhere, wait_for_files
from .kernels import Kernel
from .spark_fixtures import BARRIER_FAILS_FAST, TWO_EXECUTORS, shared_spark_session


@pytest.fixture(scope="module")
def cluster():
    with shared_spark_session(TWO_EXECUTORS, BARRIER_FAILS_FAST) as session:
        check_slots(session, 2, wait=60)  # executors register after the session starts
        yield session


def test_a_session_on_spark_keeps_its_ranks_in_the_executors_and_frees_the_slots(ip, cluster, capsys):
    try:
        ip.run_line_magic("horovod", "start np=2")
        assert "live session: 2 ranks" in capsys.readouterr().err
        pids = sorted(info.started.pid for info in sessions.current().ranks.values())
        in_executors = {child.pid for e in executor_processes() for child in e.children(recursive=True)}
        assert set(pids) <= in_executors  # the ranks are the executors' children: a barrier stage
        ip.run_cell_magic("horovod", "", "import os, torch\nw = torch.tensor([hvd.rank() + 1.0])")
        ip.run_cell_magic("horovod", "", "w *= 10")
        assert ip.run_cell_magic("horovod", "", "hvd.allreduce(w, op=hvd.Sum).item()") == 30.0
        assert sorted(ip.run_cell_magic("horovod", "", "hvd.allgather_object(os.getpid())")) == pids
    finally:
        ip.run_line_magic("horovod", "stop")
    assert gone_within(30) == []
    cold = "import horovod.torch as hvd, torch\nhvd.init()\n"
    cold += "hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()"
    assert ip.run_cell_magic("horovod", "np=2", cold) == 2.0  # the slots are free again


KILL_EXECUTOR = """
import psutil
executor = psutil.Process()
while executor is not None and "CoarseGrainedExecutorBackend" not in " ".join(executor.cmdline()):
    executor = executor.parent()
executor.kill()
time.sleep(120)  # the rank goes with its executor
"""


def test_a_run_that_loses_an_executor_resumes_on_the_one_spark_brings_back(ip, cluster, tmp_path, capsys):
    from .test_retry import STEPS, training

    fault = KILL_EXECUTOR.strip().replace("\n", "\n        ")
    cell = "import time\n" + training(tmp_path, fault)
    before = {e.pid for e in executor_processes()}
    assert ip.run_cell_magic("horovod", "np=2 retries=1", cell) == 2.0 * STEPS  # as if never lost
    shown = capsys.readouterr().err
    assert "attempt 2 of 2 from step 20" in shown and "finished on attempt 2 of 2" in shown
    assert "executor or host lost: rank" in shown  # the class that ended the first attempt
    assert (tmp_path / "resumed-1-20").exists()
    assert len(before - {e.pid for e in executor_processes()}) == 1  # one executor JVM was lost
    assert gone_within(30) == []


# The ranks' exit held up (an atexit handler of the user's) until the next cell has been sent.
SLOW_EXIT = """%%horovod
import atexit, os, time
def leaving():
    open(os.path.join({folder!r}, f"leaving-{{hvd.rank()}}"), "w").close()
    time.sleep(4)
atexit.register(leaving)
"""


@pytest.mark.parametrize("when", ["gone", "leaving"])
def test_ranks_leave_a_notebook_that_went_silent(tmp_path, when):
    """A kernel that stops answering (stopped here; or busy holding the GIL) sends no beats: its
    ranks exit on their own after the silence limit. The next cell runs on a new session, once,
    whether they are gone when it is sent or still on their way out (it never runs on them)."""
    env = {**os.environ, "HVD_MAGIC_SESSION_SILENCE": "5"}
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=env)
    kernel = Kernel(manager, client)
    try:
        assert kernel.run("%load_ext hvd_magic\n%horovod start np=-2 launcher=gloo").status == "ok"
        assert kernel.run("%%horovod\nimport os\nw = os.getpid()").status == "ok"
        if when == "leaving":
            assert kernel.run(SLOW_EXIT.format(folder=str(tmp_path))).status == "ok"
        ranks = [p for p in kernel.processes() if is_rank(p.cmdline())]
        assert len(ranks) == 2
        os.kill(manager.provisioner.process.pid, signal.SIGSTOP)
        try:
            if when == "gone":
                assert gone_within(30) == []  # 5 s of silence, then the ranks leave
            else:  # both are leaving, and will be for seconds
                marks = [tmp_path / f"leaving-{rank}" for rank in (0, 1)]
                assert wait_for_files(marks, 30), "the ranks never started to leave"
        finally:
            os.kill(manager.provisioner.process.pid, signal.SIGCONT)
        outcome = kernel.run("%%horovod\n'w' in globals()")
        assert outcome.status == "ok" and outcome.value == "False", outcome  # the next cell starts anew
        shown = "".join(outcome.shown)
        assert "starting a new one" in shown and "heard nothing from the notebook for 5 s" in shown, shown
        if when == "leaving":  # sent to the ranks on their way out: it ran on the new session instead
            assert "the cell did not run on the ranks that left: it runs on a new session" in shown, shown
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert run_processes_anywhere() == []
