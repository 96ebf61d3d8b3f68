"""%%horovod np=N on a real local-cluster: two executor JVMs, fake GPUs, real mpirun/Gloo.
The plan the driver makes is also tested pure."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from hvd_magic import (
    FailureClass,
    HorovodRunner,
    LaunchError,
    RankFailedError,
    RunError,
    RunInterrupted,
    RunTimeout,
)
from hvd_magic.launch import spark as spark_launch
from hvd_magic.launch import spark_job, spark_plan
from hvd_magic.launch.spark_session import check_slots
from hvd_magic.launch.task.barrier import STAGE_SCHEMA
from hvd_magic.protocol import Join, LauncherExit, LauncherLog, Message, RankError, SparkPlan, Stopped
from hvd_magic.run.diagnosis import failure_after_exit, rank_failed
from hvd_magic.run.record import RunRecord

from . import spark_jvm
from .guards import Guard, bench
from .helpers import (
    ALLREDUCE_FOREVER,
    SLEEP_FOREVER,
    WAIT_FOR_GO,
    executor_processes,
    gone_within,
    leftover_processes,
    placed_ranks,
    run_processes_anywhere,
    stopped_by_a_notice,
    waiting_cell,
    when_started,
)
from .multihost_net import free_subnet, make_bridge
from .panel_helpers import served
from .spark_fixtures import TWO_EXECUTORS_FOUR_GPUS, gpu_conf, shared_spark_session
from .test_house import LOADED_CELL, NEVER_IN_A_RANK, RANK_SIDE, within

REPORT_CELL = """
import json, os, horovod.torch as hvd, torch
hvd.init()
me = {"rank": hvd.rank(), "local_rank": hvd.local_rank(), "size": hvd.size(),
      "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "host": os.environ.get("HVD_MAGIC_VIA_AGENT"),
      "pid": os.getpid(), "threads": os.environ.get("OMP_NUM_THREADS"),
      "idle_wait": os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
      "sum": hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()}
[json.loads(s) for s in hvd.allgather_object(json.dumps(me))]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    conf = gpu_conf(tmp_path_factory.getbasetemp() / "gpus")  # an executor decommissions on SIGPWR
    with shared_spark_session(TWO_EXECUTORS_FOUR_GPUS, conf) as session:
        check_slots(session, 4, wait=60)  # executors register after the session starts
        yield session


@pytest.fixture
def plans(monkeypatch):
    """Records the plans the launcher makes (the real function still runs)."""
    made = []
    real = spark_plan.make_plan

    def spy(joins, launcher):
        made.append(real(joins, launcher))
        return made[-1]

    monkeypatch.setattr(spark_plan, "make_plan", spy)
    return made


def test_spark_plan_groups_tasks_by_executor_and_numbers_ranks_host_by_host():
    tasks = [
        (0, "a:1", "10.0.0.1", 0),
        (1, "b:1", "10.0.0.2", 0),
        (2, "a:1", "10.0.0.1", 1),
        (3, "b:1", "10.0.0.2", 1),
    ]
    joins = [
        Join(partition=p, executor=e, ip=ip, gpus=[str(g)], agent=f"tcp://{ip}:1") for p, e, ip, g in tasks
    ]
    plan = spark_plan.make_plan(list(reversed(joins)), "gloo")
    assert [(h.token, h.partitions, h.gpus) for h in plan.hosts] == [
        ("hvd-host-0", [0, 2], [["0"], ["1"]]),
        ("hvd-host-1", [1, 3], [["0"], ["1"]]),
    ]
    assert plan.mpirun_partition == 0
    assert dataclasses.asdict(plan.slots[2]) == {
        "hostname": "hvd-host-0",
        "rank": 1, "size": 4, "local_rank": 1, "local_size": 2, "cross_rank": 0, "cross_size": 2,
        "group_rank": 0, "group_size": 2,
    }  # fmt: skip
    assert plan.slots[1].rank == 2
    assert SparkPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan  # as the tasks get it


def test_np4_spreads_over_both_executors_with_each_rank_on_its_slots_gpu(ip, cluster, plans):
    ranks = ip.run_cell_magic("horovod", "np=4", REPORT_CELL)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["size"] for r in ranks} == {4} and {r["sum"] for r in ranks} == {10.0}
    (plan,) = plans
    assert len(plan.hosts) == 2 and len({h.executor for h in plan.hosts}) == 2
    # Every rank was started through the exec agent of its executor, none by ssh.
    assert sorted(r["host"] for r in ranks) == ["hvd-host-0", "hvd-host-0", "hvd-host-1", "hvd-host-1"]
    gpus_by_host = {h.token: h.gpus for h in plan.hosts}
    for rank in ranks:
        assert [rank["gpus"]] == gpus_by_host[rank["host"]][rank["local_rank"]]
    for host in plan.hosts:
        assert sorted(g for [g] in host.gpus) == ["0", "1"]  # two slots, two different GPUs
    assert {r["threads"] for r in ranks} == {"1"}  # spark.task.cpus=1 per rank
    assert {r["idle_wait"] for r in ranks} == {"1"}  # MPI's waits yield the core they share
    assert leftover_processes() == []


def test_the_next_cells_tasks_run_in_the_python_workers_spark_kept_from_the_last(ip, cluster, tmp_path):
    """Spark keeps a task's Python worker for the next task only if the task read all its input;
    then a cell's tasks do not start (and import our task code) anew in fresh workers."""
    cell = (
        "import os, pathlib\n"
        "pathlib.Path({folder!r}, os.environ['RANK']).write_text(str(os.getppid()))  # the task's pid\n"
    )
    workers = []
    for run in ("first", "second"):
        folder = tmp_path / run
        folder.mkdir()
        ip.run_cell_magic("horovod", "np=4 backend=torch", cell.format(folder=str(folder)))
        workers.append(sorted(path.read_text() for path in folder.iterdir()))
    assert len(set(workers[0])) == 4  # four slots, four tasks, each in its own worker
    assert workers[1] == workers[0]
    assert leftover_processes() == []


def test_the_suites_spark_jvms_map_its_class_archive(cluster):
    """The suite's own speed (tests/spark_jvm.py): the driver and both executors load Spark's
    classes from the archive, not anew (a folder put on their class path, another Java or a jar
    added would silently cost some 10 CPU-s a cluster)."""
    archive = str(spark_jvm.archive_path())
    jvms = [p for p in psutil.Process().children(recursive=True) if p.name() == "java"]
    assert len(jvms) == 3  # the driver (its master and worker in it) and two executors
    for jvm in jvms:
        assert archive in Path(f"/proc/{jvm.pid}/maps").read_text(), jvm.cmdline()


# Each rank of a PyTorch cell writes where it runs: what forked it, what kept that, its budget.
WARM_CELL = """
import json, os, pathlib, torch
def stat(pid):
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
def cmdline(pid):
    return " ".join(part for part in open(f"/proc/{pid}/cmdline").read().split("\\0") if part)
waiter = os.getppid()
server = int(stat(waiter)[1])
seen = {"command": cmdline(os.getpid()), "waiter": cmdline(waiter), "server": server,
        "serves": cmdline(server), "threads": torch.get_num_threads(),
        "budget": os.environ.get("OMP_NUM_THREADS"), "agent": os.environ.get("HVD_MAGIC_VIA_AGENT"),
        "socket": os.environ.get("HVD_MAGIC_FORK_SERVER")}
pathlib.Path(FOLDER, str(os.getpid())).write_text(json.dumps(seen))
"""


@pytest.mark.parametrize("launcher", ["mpi", "gloo", "torch"])
def test_torch_ranks_on_executors_are_forked_from_a_server_each_executors_python_daemon_keeps(
    ip, cluster, tmp_path, launcher
):
    """PyTorch is imported once per executor, not once per rank or per Python worker: the
    executor's tasks share one server, kept by its Python daemon (which Spark keeps as long as
    the executor); the next cell's ranks are forked from the same servers, and each is what a
    started rank would be."""
    option = "backend=torch" if launcher == "torch" else f"launcher={launcher}"
    servers = []
    for run in ("first", "second"):
        folder = tmp_path / run
        folder.mkdir()
        ip.user_ns["FOLDER"] = str(folder)
        ip.run_cell_magic("horovod", f"np=4 {option}", WARM_CELL)
        ranks = [json.loads(path.read_text()) for path in folder.iterdir()]
        assert len(ranks) == 4
        for rank in ranks:
            assert rank["command"].endswith("-m hvd_magic.rank.worker")  # as ps shows a started rank
            assert "hvd_magic.warm.fork_server" in rank["waiter"]
            assert python_daemon(keeper_of(rank["serves"]))  # kept by the executor's Python daemon
            assert rank["threads"] == int(rank["budget"]) == 1  # spark.task.cpus, not the server's
            assert rank["socket"] is None  # the stand-in's word to find its server is not the rank's
            assert (rank["agent"] is not None) == (launcher == "mpi")  # orted, on its agent's host
        used = {rank["server"] for rank in ranks}
        assert len(used) == 2  # one per executor, whatever the launcher
        assert used <= kept_servers()  # kept after the run, for the next
        servers.append(kept_servers())
    assert servers[1] == servers[0]  # none started anew for the second cell
    assert leftover_processes() == [] and run_processes_anywhere() == []


def test_the_next_cell_is_warm_after_spark_ended_the_python_workers_that_started_its_servers(
    ip, cluster, tmp_path
):
    """Spark ends an idle Python worker after a minute without a task, and kills a cancelled
    task's: the servers are the executors' (their Python daemons keep them), so a cell after
    that is forked from the same ones."""
    before = set()
    for run in ("first", "second"):
        folder = tmp_path / run
        folder.mkdir()
        ip.user_ns["FOLDER"] = str(folder)
        ip.run_cell_magic("horovod", "np=4 backend=torch", WARM_CELL)
        used = {json.loads(path.read_text())["server"] for path in folder.iterdir()}
        assert len(used) == 2 and used <= kept_servers()
        assert not before or used == before
        before = used
        workers = python_workers()  # what Spark would end
        for worker in workers:
            worker.kill()
        assert workers and psutil.wait_procs(workers, timeout=30)[1] == []
    assert leftover_processes() == [] and run_processes_anywhere() == []


def python_workers() -> list[psutil.Process]:
    """Every Python worker of this test's executors (not their daemons)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # another test's process may be a zombie by now
            if "pyspark.daemon" in " ".join(process.cmdline()) and not python_daemon(process.pid):
                found.append(process)
    return found


def keeper_of(server: str) -> int:
    """The keeper a shared fork server's command line names (``--keeper PID``)."""
    argv = server.split()
    return int(argv[argv.index("--keeper") + 1])


def python_daemon(pid: int) -> bool:
    """Whether ``pid`` is an executor's Python daemon (not one of the workers it forks, whose
    command line is the same): its parent is the executor's JVM."""
    process = psutil.Process(pid)
    return "pyspark.daemon" in " ".join(process.cmdline()) and process.parent().name() == "java"


def kept_servers() -> set[int]:
    """The fork servers this test's executors keep: those whose keeper is below this process,
    whose driver JVM starts the executors (not another xdist worker's)."""
    below = {process.pid for process in psutil.Process().children(recursive=True)}
    found = set()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if "--keeper" in (argv := " ".join(process.cmdline())) and "hvd_magic.warm.fork_server" in argv:
                waiter = "hvd_magic.warm.fork_server" in " ".join(process.parent().cmdline())  # forked by one
                if not waiter and keeper_of(argv) in below and python_daemon(keeper_of(argv)):
                    found.add(process.pid)
    return found


def test_gloo_launcher_on_spark_serves_its_store_to_its_ranks_only(ip, cluster, tmp_path):
    forged: dict[int, tuple[str, int | None]] = {}

    def forge() -> None:  # from this process, the driver's: not a descendant of any task
        for rank in range(4):
            host, port = (tmp_path / f"started-{rank}").read_text().split(":")
            forged[rank] = (host, _answer_to_a_forged_request(host, int(port)))
        (tmp_path / "go").touch()

    when_started(tmp_path, 4, forge)
    cell = (
        "import os, pathlib, horovod.torch as hvd\nhvd.init()\n"
        f"d = pathlib.Path({str(tmp_path)!r})\n"
        "store = os.environ['HOROVOD_GLOO_RENDEZVOUS_ADDR'] + ':'\n"
        "store += os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']\n"
        "(d / f'.{hvd.rank()}').write_text(store)\n"
        "(d / f'.{hvd.rank()}').rename(d / f'started-{hvd.rank()}')\n" + WAIT_FOR_GO
    )
    ranks = ip.run_cell_magic("horovod", "np=4 launcher=gloo", "import time\n" + cell + REPORT_CELL)
    assert {r["sum"] for r in ranks} == {10.0}
    assert sorted(r["gpus"] for r in ranks) == ["0", "0", "1", "1"]
    assert forged == {rank: ("127.0.0.1", None) for rank in range(4)}  # loopback, and closed unanswered


def _answer_to_a_forged_request(host: str, port: int) -> int | None:
    import http.client

    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request("GET", "/global/0")
        return connection.getresponse().status
    except (http.client.RemoteDisconnected, ConnectionResetError):
        return None
    finally:
        connection.close()


PASSING_BRIDGE = "hvdpassing0"


@pytest.fixture
def passing_bridge():
    """A bridge with an address of the machine, as a container runtime or a VPN adds and removes."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("making a network bridge needs root and iproute2")
    make_bridge(free_subnet("10.214"), PASSING_BRIDGE)  # not the bed's 10.213: it may run beside
    try:
        yield PASSING_BRIDGE
    finally:
        subprocess.run(["ip", "link", "del", PASSING_BRIDGE], capture_output=True, check=False)


def test_mpi_ranks_go_on_when_an_interface_they_did_not_need_goes_mid_run(
    ip, cluster, tmp_path, passing_bridge
):
    """Open MPI left to itself spreads its connections over every interface, and one deleted
    mid-run hung the ranks in their next allreduce (the multi-host bed's bridge, deleted at its
    end, hung an estimator's fit beside it). They keep to the interface of their host's address."""

    def delete_it() -> None:
        subprocess.run(["ip", "link", "del", passing_bridge], capture_output=True, check=True)
        (tmp_path / "go").touch()

    when_started(tmp_path, 4, delete_it)
    cell = (
        "import pathlib, time, horovod.torch as hvd, torch\nhvd.init()\n"
        f"d = pathlib.Path({str(tmp_path)!r})\n"
        "total = hvd.allreduce(torch.ones(1000), name='before', op=hvd.Sum).sum()\n"  # connections made
        "(d / f'started-{hvd.rank()}').touch()\n" + WAIT_FOR_GO + "for i in range(50):\n"
        "    total += hvd.allreduce(torch.ones(1000), name=f'after-{i % 4}', op=hvd.Sum).sum()\n"
        "float(total)"
    )
    assert ip.run_cell_magic("horovod", "np=4 timeout=90", cell) == 51 * 4 * 1000.0
    assert (tmp_path / "go").exists()  # deleted before the allreduces after


def test_timeline_written_on_an_executor_comes_back_to_the_notebook(ip, cluster, tmp_path):
    from hvd_magic.timeline import read, spans

    destination = tmp_path / "spark_timeline.json"
    cell = (
        "import os, horovod.torch as hvd, torch\nhvd.init()\n"
        "for _ in range(3):\n    hvd.allreduce(torch.ones(8), name='grad')\n"
        "os.environ['HOROVOD_TIMELINE']"
    )
    written_at = ip.run_cell_magic("horovod", f"np=4 timeline={destination}", cell)
    assert written_at != str(destination) and not os.path.exists(written_at)  # streamed back, then removed
    timeline = read(destination)
    assert "allreduce.grad" in timeline.tensors.values()
    assert "ALLREDUCE" in set(spans(timeline)["name"])


@pytest.mark.parametrize("framework", ["", "import torch  # warm: forked from a server\n"])
def test_a_rank_on_an_executor_loads_only_the_rank_side(ip, cluster, framework):
    ip.user_ns["NEVER"] = list(NEVER_IN_A_RANK)
    loaded, heavy = json.loads(ip.run_cell_magic("horovod", "np=2 launcher=gloo", framework + LOADED_CELL))
    assert [name for name in loaded if name != "hvd_magic" and not within(name, *RANK_SIDE)] == []
    assert "hvd_magic.rank.payload" in loaded and heavy == []  # a rank's list, with no pyspark


def test_failing_rank_on_spark_names_rank_and_host(ip, cluster):
    cell = (
        "import horovod.torch as hvd, torch\nhvd.init()\n"
        "if hvd.rank() == 3:\n    raise ValueError('bad shard')\n"
        "hvd.allreduce(torch.tensor([1.0]))\n"
    )

    with pytest.raises(RankFailedError) as info:
        ip.run_cell_magic("horovod", "np=4", cell)
    assert run_processes_anywhere() == []  # at once
    assert info.value.rank == 3 and info.value.exc_type == "ValueError" and info.value.host
    assert "bad shard" in info.value.remote_traceback
    assert leftover_processes() == []
    assert HorovodRunner(np=2).run(rank_sum()) == 3.0  # the cluster is usable again


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_a_rank_killed_on_an_executor_is_named(ip, cluster, launcher):
    cell = (
        "import os, signal, horovod.torch as hvd, torch\nhvd.init()\n"
        "if hvd.rank() == 2:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "for _ in range(100):\n    hvd.allreduce(torch.tensor([1.0]))\n"
    )
    with pytest.raises(RunError) as info:
        ip.run_cell_magic("horovod", f"np=4 launcher={launcher}", cell)
    message = str(info.value)
    assert "rank 2 was killed by signal 9 (SIGKILL)" in message or (
        isinstance(info.value, RankFailedError) and info.value.rank == 2 and "signal 9" in message
    ), message
    assert gone_within(10) == []


def test_a_breakpoint_on_an_executor_is_a_prompt_at_the_notebook(ip, cluster, monkeypatch, capsys):
    """Only rank 3's breakpoint stops (the notebook's choice travels to the executors)."""
    monkeypatch.setenv("HVD_MAGIC_BREAKPOINT_RANKS", "3")
    typed, asked = ["p x + 1", "c"], []
    monkeypatch.setattr("builtins.input", lambda prompt="": (asked.append(prompt), typed.pop(0))[1])
    cell = (
        "import horovod.torch as hvd, torch\nhvd.init()\nx = hvd.rank() * 10\nbreakpoint()\n"
        "hvd.allreduce(torch.tensor([float(x)]), op=hvd.Sum).item()\n"
    )
    assert ip.run_cell_magic("horovod", "np=4", cell) == 60.0
    assert len(asked) == 2 and all(prompt.startswith("rank 3 on ") for prompt in asked), asked
    assert "\n31\n" in capsys.readouterr().out  # rank 3's x, on its executor


def test_a_decommission_notice_checkpoints_where_the_ranks_are_and_the_run_goes_on(
    ip, cluster, tmp_path, capsys
):
    """Spark decommissions an executor of the run (SIGPWR, spark.decommission.enabled): the ranks
    hear it at their next stopping(), checkpoint there and stop; the run starts again from that
    checkpoint: every step counted once, none lost past the notice."""
    executor = executor_processes()[0]
    when_started(tmp_path, 4, lambda: os.kill(executor.pid, signal.SIGPWR))
    total, starts = ip.run_cell_magic("horovod", "np=4 retries=1", stopped_by_a_notice(tmp_path))
    assert len(starts) == 2 and starts[0] == 0 and 0 < starts[1] < 3000, starts
    assert total == starts[1] + 20  # the steps before the notice, then the second attempt's 20
    shown = capsys.readouterr()
    said = shown.out + shown.err
    assert "preemption notice: Spark is decommissioning executor" in said, said[-2000:]
    assert "hvd_magic: stopping: Spark is decommissioning executor" in said
    assert f"attempt 2 of 2 from step {starts[1]}" in said


def test_deaths_on_spark_leave_the_host_to_the_ranks_own_report():
    """mpirun and the plan call hosts hvd-host-N: a death carries no host, so the error names
    the rank's real host from its own report (found on the multi-host bed: "rank 2 on hvd-host-2")."""
    session = SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: "127.0.0.1"))
    mpi = spark_launch.SparkLauncher(3, "mpi", session)
    mpi.log.append("mpirun noticed that process rank 2 with PID 7 on node hvd-host-2 exited on signal 9")
    [death] = mpi.deaths()
    assert (death.rank, death.host) == (2, "") and "signal 9" in death.what
    torch = spark_launch.SparkLauncher(3, "torch", session)  # as gloo: each task starts its rank
    torch.hub = SimpleNamespace(send_to=lambda *args: None)  # type: ignore[assignment]
    for partition in range(3):
        join = Join(partition, f"10.0.0.{partition}:7000", f"10.0.0.{partition}", port=29500)
        torch.take(Message(join, identity=f"task{partition}".encode()))
    torch.take(Message(LauncherExit(-9), identity=b"task2"))  # the task of rank 2 saw it killed
    [death] = torch.deaths()
    assert (death.rank, death.host) == (2, "") and "signal 9" in death.what


def test_a_rank_interrupted_by_its_task_carries_what_the_task_said():
    """A Spark task that stops its ranks on its own (it lost the notebook's connection; its exec
    agent heard no ping) says so in the launcher's output; a rank's KeyboardInterrupt before the
    notebook stopped the run then carries those lines, not mpirun's own output."""
    session = SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: "127.0.0.1"))
    launcher = spark_launch.SparkLauncher(4, "mpi", session)
    lost = "hvd_magic: a Spark task lost the notebook's connection 1.2 s ago: its ranks are stopped"
    for line in ("[vm:01234] orted: starting", lost):
        launcher.take(Message(LauncherLog(), identity=b"task1", blob=line.encode()))
    record = RunRecord(4)
    record.apply(Message(RankError("vm", "KeyboardInterrupt", "", "Traceback ..."), 3), at=1.0)
    error = rank_failed(record, None, launcher.ended_by, launcher.said())
    assert error.failure is FailureClass.KILLED and error.__notes__ == [f"its launcher said:\n{lost}"]


def test_a_host_mpirun_lost_ends_the_run_naming_the_host_its_ranks_and_the_notebook():
    """A host that dies or is cut off (found on the multi-host bed): mpirun may wait on for its
    daemon, so the run ends on the report; every rank of that host is named, not blamed on others."""
    session = SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: "127.0.0.1"))
    mpi = spark_launch.SparkLauncher(4, "mpi", session)
    mpi.hub = SimpleNamespace(address="tcp://10.0.0.9:5000", send_to=lambda *args: None)  # type: ignore[assignment]
    for p in range(4):
        join = Join(p, f"10.0.0.{1 + p // 2}:7000", f"10.0.0.{1 + p // 2}")
        mpi.take(Message(join, identity=f"task{p}".encode()))  # the plan goes out once all joined
    assert mpi.poll() is None
    mpi.take(Message(LauncherLog(), blob=b"  Remote daemon: [[1,0],2] on node hvd-host-1\n"))
    assert mpi.poll() == 1
    deaths = mpi.deaths()
    assert [(d.rank, d.host_lost) for d in deaths] == [(2, True), (3, True)]
    assert "host 10.0.0.2" in deaths[0].what and "ranks 2, 3" in deaths[0].what
    assert "notebook at 10.0.0.9:5000" in deaths[0].what
    record = RunRecord(4)
    record.started = {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"}
    message = str(failure_after_exit(record, 1, deaths, ""))
    assert "rank 2 on hostB was lost with its host 10.0.0.2" in message, message
    assert "ranks [0, 1] were stopped" in message, message


def rank_sum():
    def main() -> float:  # nested: pickled by value, as a notebook function would be
        import horovod.torch as hvd
        import torch

        hvd.init()
        return float(hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item())

    return main


def test_more_ranks_than_slots_fails_fast_with_advice(cluster):
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        HorovodRunner(np=6).run(rank_sum())
    assert time.monotonic() - started < 60  # Spark alone would retry the barrier stage for 10 minutes
    message = str(info.value)
    assert "np=6" in message and "has 4" in message and "spark.executor" in message


def test_executors_are_waited_for_only_where_the_configuration_allows_enough_slots():
    from hvd_magic.launch.spark_session import slot_wait

    def session(**settings: str) -> SimpleNamespace:
        settings = {key.replace("_", "."): value for key, value in settings.items()}
        return SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: settings.get(key, default)))

    assert slot_wait(session(spark_master="local-cluster[2,2,1024]"), 6, 10.0) == 0.0  # 4 at most
    assert slot_wait(session(spark_master="local-cluster[2,2,1024]"), 4, 10.0) == 10.0  # still joining
    assert slot_wait(session(spark_master="local[4]", spark_task_cpus="2"), 3, 10.0) == 0.0
    static = session(spark_master="yarn", spark_executor_instances="2", spark_executor_cores="4")
    assert slot_wait(static, 9, 10.0) == 0.0 and slot_wait(static, 8, 10.0) == 10.0
    assert slot_wait(session(spark_master="spark://host:7077"), 64, 10.0) == 10.0  # it does not say


def test_run_secrets_never_appear_on_command_lines(ip, cluster, monkeypatch):
    from hvd_magic import hub as hub_module

    made = []
    real = hub_module.RunKeys.generate

    def spy():
        made.append(real())
        return made[-1]

    monkeypatch.setattr(hub_module.RunKeys, "generate", staticmethod(spy))
    # Rank 0 reads the process table (and its own environment) while mpirun, the agents, orted
    # and all ranks are alive.
    cell = (
        "import os, subprocess, horovod.torch as hvd\nhvd.init()\nhvd.barrier()\n"
        "table = subprocess.run(['ps', '-ww', '-eo', 'args'], capture_output=True, text=True).stdout\n"
        "hvd.barrier()\ntable + repr(dict(os.environ))"  # what a cell printing its environment shows
    )
    table = ip.run_cell_magic("horovod", "np=4", cell)
    assert "hvd_magic.launch.task.agent hvd-host-1" in table and "orted" in table
    assert len(made) == 2  # the hub's keys and the exec agents' keys
    for keys in made:
        for secret in (keys.client_secret, keys.server_secret):
            assert secret.decode() not in table


def test_interrupt_on_spark_stops_every_rank_on_every_executor(ip, cluster, tmp_path):
    interrupted = []
    when_started(
        tmp_path, 4, lambda: (interrupted.append(time.monotonic()), os.kill(os.getpid(), signal.SIGINT))
    )
    with pytest.raises(RunInterrupted):
        ip.run_cell_magic("horovod", "np=4", waiting_cell(tmp_path, wait=ALLREDUCE_FOREVER, horovod=True))
    assert run_processes_anywhere() == []  # at once: the stop is complete when the cell returns
    elapsed = time.monotonic() - interrupted[0]
    assert elapsed < 20, f"the interrupt took {elapsed:.1f} s"  # the 5 s target: bench/stop.py
    assert HorovodRunner(np=2).run(rank_sum()) == 3.0  # the next run works


def stoppable(gate: str):
    def main() -> str:  # nested: pickled by value
        import os
        import time

        import horovod.torch as hvd

        import hvd_magic

        hvd.init()
        for step in range(1, 3000):
            if hvd_magic.stopping():
                return f"stopped at step {step}"
            hvd_magic.report(step=step)
            while step == 2 and not os.path.exists(gate):  # held here until the panel has seen it
                time.sleep(0.05)
            time.sleep(0.02)
        return "not stopped"

    return main


def test_a_runners_call_on_spark_is_listed_on_the_panel_and_stopped_there_with_its_value(cluster, tmp_path):
    """The Horovod panel, as the server asks the kernel's record: a HorovodRunner call on the
    cluster is listed as running, with the Spark master and launcher and the executors' host;
    the panel's stop (at the next step boundary) ends it with rank 0's value, and it is listed
    as ended with that value."""
    gate, seen = tmp_path / "go", {}
    with served(tmp_path) as panel:

        def watch() -> None:
            seen["running"] = panel.wait_for(lambda run: run["state"] == "running" and run.get("step") == 2)
            seen["asked"] = panel.ask({"ask": "stop", "number": seen["running"]["number"]})
            gate.touch()

        watching = threading.Thread(target=watch, daemon=True)
        watching.start()
        try:
            value = HorovodRunner(np=2).run(stoppable(str(gate)))
        finally:
            gate.touch()  # the ranks are let go whatever the panel saw
            watching.join(timeout=60)
        running = seen["running"]
        assert (running["where"], running["ranks"]) == ("2 ranks on Spark", 2)
        assert running["launcher"] == "Spark local-cluster[2,2,1024] · Horovod (mpirun)"
        assert running["hosts"] == [socket.gethostname()]  # the executors' (both on this machine)
        assert seen["asked"] == {"asked": "stop at the next step boundary"}
        assert re.fullmatch(r"stopped at step \d+", value) and int(value.split()[-1]) >= 3, value
        ended = panel.row(running["number"])
    assert (ended["state"], ended["outcome"], ended["value"]) == ("ended", "finished", repr(value))
    assert ended["launcher"] == running["launcher"] and ended["has_value"]
    assert run_processes_anywhere() == []


def test_a_spark_rank_whose_python_cannot_run_is_dumped_by_py_spy_on_its_own_host(ip, cluster, tmp_path):
    """At the timeout, rank 1 is in a C call that holds Python's lock (libc's sleep through
    ctypes.PyDLL) and cannot answer: the Spark task it runs under dumps it with py-spy on the
    executor's host and sends the dump back, native frames and the cell's line."""
    cell = "import ctypes, time, torch.distributed as dist, hvd_magic\ndist.init_process_group('gloo')\n"
    cell += "dist.barrier()\nhvd_magic.report(step=1)\n"
    cell += "if dist.get_rank() == 1:\n    ctypes.PyDLL(None).sleep(90)\ntime.sleep(90)\n"
    # timeout= counts silence from the ranks' start too: 20 s leaves a loaded machine time to
    # import torch (the bed's three ranks once took more than 5 s and timed out in the import)
    with pytest.raises(RunTimeout) as timed_out:
        ip.run_cell_magic("horovod", "np=2 backend=torch timeout=20", cell)
    said = str(timed_out.value)
    assert re.search(
        r"^rank 1 on \S+: no answer from its Python \(a C call holds its lock\); py-spy dump", said, re.M
    )
    assert "sleep (libc" in said and "<horovod cell>:6" in said, said
    assert re.search(
        r"^rank 0 on \S+: in <module> \(<horovod cell>:7\)|^rank 0 on \S+: in line 7 of the cell", said, re.M
    )
    assert run_processes_anywhere() == []


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_nothing_is_left_when_a_timed_out_spark_cell_returns(ip, cluster, tmp_path, launcher):
    # only SIGKILL stops these ranks; each reports until all four started, so the 5 s of silence
    # begin once every rank is in the cell, however slowly a loaded machine starts one
    every_rank_in = (
        f"while len(list(pathlib.Path({str(tmp_path)!r}).glob('started-*'))) < 4:\n"
        "    hvd_magic.report(waiting=1.0)\n    time.sleep(0.2)\n"
    )
    cell = "import hvd_magic\n" + waiting_cell(
        tmp_path, ignore_signals=True, wait=every_rank_in + SLEEP_FOREVER
    )
    with pytest.raises(RunTimeout) as timed_out:
        ip.run_cell_magic("horovod", f"np=4 launcher={launcher} timeout=5", cell)
    assert run_processes_anywhere() == []
    # where each rank was, asked of the ranks on the executors over their own connections: in
    # the cell (its sleep), each rank answering
    placed = placed_ranks(str(timed_out.value), "at the timeout")
    assert sorted(placed) == [0, 1, 2, 3] and all("of the cell" in where for where in placed.values()), placed


def test_executor_lost_mid_run_is_a_clear_error(ip, cluster, tmp_path):
    executors = executor_processes()
    assert len(executors) == 2
    killed = []
    when_started(tmp_path, 4, lambda: (killed.append(time.monotonic()), executors[1].kill()))
    with pytest.raises((RankFailedError, RunError)) as info:
        # in a collective: the other executor's ranks see their peers go (Horovod's error), and
        # are still named as stopped because of the lost executor
        ip.run_cell_magic("horovod", "np=4", waiting_cell(tmp_path, wait=ALLREDUCE_FOREVER, horovod=True))
    assert killed, f"the run ended before the executor was killed: {info.value}"
    assert time.monotonic() - killed[0] < 90  # Spark alone would retry the stage for 10 minutes
    message = str(info.value)
    assert "ExecutorLostFailure (executor" in message and "exited" in message, message
    # the first cause named: the executor, its ranks and Spark's word; the others stopped by it
    pattern = (
        r"executor or host lost: rank (\d) on \S+ was lost with executor \d+ on [\d.]+ \(ranks (\d), (\d)\): "
        r"Spark lost the executor \(Command exited with code 137\); "
        r"ranks \[(\d), (\d)\] were stopped because of it"
    )
    found = re.search(pattern, message)
    assert found is not None, message
    first, *on_it, stopped_a, stopped_b = found.groups()
    assert first == on_it[0] and sorted([*on_it, stopped_a, stopped_b]) == ["0", "1", "2", "3"], message
    assert gone_within(10) == []


def test_a_job_whose_run_ended_well_ends_before_the_next_launch_starts(cluster):
    """A run is over once every task confirmed its end: Spark's end of the job (its tasks
    returning, their slots going back) is left to the next launch to wait for, not the cell."""

    def returning_late(batches):  # a task that returns 2 s after its work: Spark's end, made long
        import time

        import pyarrow as pa

        for _ in batches:
            pass
        time.sleep(2)
        yield pa.RecordBatch.from_pydict({"code": [0]}, schema=pa.schema([("code", pa.int64())]))

    job = spark_job.SparkJob(cluster, f"hvd_magic-test-{os.getpid()}")
    said: list[str] = []
    stage = cluster.range(0, 2, 1, 2)
    job.start(lambda: stage.mapInArrow(returning_late, STAGE_SCHEMA, barrier=True), lambda: True, said.append)
    job.leave()
    assert job.running()  # its tasks are still in their 2 s
    spark_job.wait_for_ending_jobs()  # as SparkLauncher.start does first
    assert not job.running() and (job.code, job.error, said) == (0, "", [])
    spark_job.wait_for_ending_jobs()  # nothing left to wait for: at once


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_a_job_cancelled_in_spark_is_named_so_and_not_retried(ip, cluster, tmp_path, launcher):
    """Someone cancels the run's Spark job (here ``cancelAllJobs``, as the Spark UI's kill or a
    job group's cancel would): the error says Spark cancelled it, in Spark's words, whatever the
    ranks then said, and retries= does not undo it."""
    when_started(tmp_path, 4, lambda: cluster.sparkContext.cancelAllJobs())
    with pytest.raises(RunError) as info:
        # ranks in a collective: the cancel also reaches them as Horovod's error, which they report
        cell = waiting_cell(tmp_path, wait=ALLREDUCE_FOREVER, horovod=True)
        ip.run_cell_magic("horovod", f"np=4 launcher={launcher} retries=2", cell)
    said = str(info.value)
    assert info.value.failure is FailureClass.CANCELLED, said
    assert not isinstance(info.value, RankFailedError), said  # the run's failure, not rank 0's
    assert said.startswith("the run was stopped: Spark cancelled the run's tasks (Job "), said
    assert "its ranks ended with it" in said, said
    assert "cancelled as part of cancellation of all jobs)" in said, said
    # (a task Spark's cancel killed before it confirmed its stop may add a note of its own first)
    notes = info.value.__notes__
    assert "attempt 2" not in said, said
    assert any(note.startswith("not retried (cancelled in Spark)") for note in notes), notes
    assert run_processes_anywhere() == []


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_the_ranks_of_an_executor_spark_lost_are_named_and_its_tasks_not_waited_for(launcher):
    joins = [
        Join(partition, executor=str(partition // 2), ip=f"10.0.0.{partition // 2}") for partition in range(4)
    ]
    plan = spark_plan.make_plan(joins, launcher)
    deaths = spark_plan.lost_executor_deaths(plan, launcher, {"1": "worker lost: 10.0.0.1 disassociated"})
    assert [(d.rank, d.failure, d.host_lost) for d in deaths] == [
        (2, FailureClass.LOST, True),
        (3, FailureClass.LOST, True),
    ]
    assert deaths[0].what == (
        "was lost with executor 1 on 10.0.0.1 (ranks 2, 3): Spark lost the executor "
        "(worker lost: 10.0.0.1 disassociated)"
    )
    gone = spark_plan.tasks_on(plan, [], executors={"1"})
    assert gone == [2, 3]
    assert spark_plan.leftovers(joins, {0: Stopped("0"), 1: Stopped("0", ["42: python"])}, gone) == [
        "42: python (executor 0)",
        "task 2 on executor 1 (10.0.0.1) did not confirm (its host or executor was lost)",
        "task 3 on executor 1 (10.0.0.1) did not confirm (its host or executor was lost)",
    ]


def test_a_tasks_word_on_its_ranks_end_keeps_the_class_its_host_saw():
    oom = "was killed by the kernel's out-of-memory killer: the memory cgroup /yarn/c1 hit its limit"
    death = spark_plan.task_death(1, LauncherExit(-9, oom, FailureClass.OOM.name))
    assert (death.rank, death.failure, death.what) == (1, FailureClass.OOM, oom)
    assert spark_plan.task_death(2, LauncherExit(-9)).failure is FailureClass.KILLED  # an older task's word
    assert (
        spark_plan.task_death(2, LauncherExit(-11, "crashed", "NO_SUCH_CLASS")).failure is FailureClass.CRASH
    )


def test_a_failed_jobs_java_error_is_cut_to_the_line_that_says_why():
    text = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover.\n"
        "ExecutorLostFailure (executor 0 exited caused by one of the running tasks) Reason: Command "
        "exited with code 137\n\tat org.apache.spark.scheduler.DAGScheduler..."
    )
    assert spark_plan.spark_failure(text).startswith("ExecutorLostFailure (executor 0 exited")
    assert spark_plan.spark_failure(text.replace("ExecutorLost", "Other")).startswith(
        "Job aborted due to stage failure: Could not recover."
    )
    assert spark_plan.spark_failure("py4j: something\nelse") == "py4j: something"
    python = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/hvd_magic/launch/spark_task.py", line 95, in barrier_stage\n'
        "ConnectionError: hvd_magic: this executor cannot reach the notebook at 10.0.0.1:5000\n"
    )
    assert (
        spark_plan.spark_failure(python)
        == "hvd_magic: this executor cannot reach the notebook at 10.0.0.1:5000"
    )


def test_a_task_that_raised_is_named_by_its_python_exception_not_by_the_stage_it_failed():
    text = (  # as Spark 4.3 words it
        "An error occurred while calling o41.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a "
        "failed barrier ResultStage. Most recent failure reason: Stage failed because barrier task "
        "ResultTask(18, 3) finished unsuccessfully.\n"
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from "
        "the Python worker: Traceback (most recent call last):\n"
        '  File "/x/hvd_magic/launch/task/barrier.py", line 131, in _run_task\n'
        "    server = servers.serving(spec.warm, spec.env, keeper=os.getppid())\n"
        "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/a.lock'\n"
        " SQLSTATE: 38000\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(...)\n"
    )
    assert spark_plan.spark_failure(text) == (
        "a task raised FileNotFoundError: [Errno 2] No such file or directory: '/tmp/a.lock'"
    )


def test_executors_that_cannot_reach_the_notebook_fail_fast_naming_the_address(cluster, monkeypatch):
    from hvd_magic.launch.spark import SparkLauncher

    from .helpers import free_port

    closed = free_port()
    real_start = SparkLauncher.start

    def start(self, hub, env):  # as if a firewall stood between the executors and the notebook
        monkeypatch.setattr(hub, "address", f"tcp://127.0.0.1:{closed}")
        real_start(self, hub, env)

    monkeypatch.setattr(SparkLauncher, "start", start)
    started = time.monotonic()
    with pytest.raises(RunError) as info:
        HorovodRunner(np=2).run(rank_sum())
    assert time.monotonic() - started < 60, "the executors' failure took long to reach the notebook"
    message = str(info.value)
    assert (
        f"cannot reach the notebook at 127.0.0.1:{closed}" in message and "HVD_MAGIC_DRIVER_HOST" in message
    )
    assert run_processes_anywhere() == []


def test_ddp_ranks_on_spark_executors_get_their_slot_and_agree(ip, cluster, plans):
    from .test_launch_torch import DDP_CELL

    ranks = ip.run_cell_magic("horovod", "np=4 backend=torch", DDP_CELL)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["params"] == ranks[0]["params"] for r in ranks)
    (plan,) = plans
    assert len(plan.hosts) == 2  # two executors, two ranks each
    for rank in ranks:
        env = rank["env"]
        assert env["RANK"] == str(rank["rank"]) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(rank["rank"] % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (plan.hosts[0].ip, str(plan.master_port))
        host = plan.hosts[rank["rank"] // 2]
        local = int(env["LOCAL_RANK"])
        assert [rank["gpus"].split(",")[local]] == host.gpus[local]  # cuda:LOCAL_RANK is its slot's GPU
    assert ranks[0]["port_held"]  # by rank 0's task, before rank 0's store listened on it
    assert run_processes_anywhere() == []


def test_a_lightning_trainer_of_one_process_a_node_runs_on_spark(ip, cluster):
    """``devices=1, num_nodes=np``, as TorchDistributor's docs write Lightning for Spark, though
    each executor here holds two ranks: each rank is made its own node (issue 79)."""
    from .test_trainers import LIGHTNING, ROWS

    cell = ROWS + LIGHTNING.format(layout="devices=1, num_nodes=4", epochs=1, before="")
    size, steps, stopped = ip.run_cell_magic("horovod", "np=4 backend=torch", cell)
    assert (size, steps, stopped) == (4, 4, False)  # 256 rows, 16 a batch on each of 4 ranks
    assert run_processes_anywhere() == []


def test_a_failing_torch_rank_on_spark_is_named(cluster):
    from .test_launch_torch import failing_last_rank

    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=4, backend="torch").run(failing_last_rank())
    assert info.value.rank == 3 and "bad batch on rank 3" in str(info.value)
    assert run_processes_anywhere() == []


def test_interrupt_stops_torch_ranks_on_every_executor(ip, cluster, tmp_path):
    from .test_launch_torch import allreducing_cell

    when_started(tmp_path, 4, lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(RunInterrupted):
        ip.run_cell_magic("horovod", "np=4 backend=torch", allreducing_cell(tmp_path))
    assert run_processes_anywhere() == []  # at once
    assert HorovodRunner(np=2).run(rank_sum()) == 3.0  # the next run works


SPARK_CELL = Guard("cold np=2 Gloo cell on Spark (local-cluster) / the same here", goal=1.3, limit=3.9)
SPARK_LIVE_CELL = Guard("live session's trivial cell / a cold np=2 cell's (Spark)", goal=0.02, limit=0.06)


def test_guard_spark_cold_cell(cluster, record_property):
    """Once the cluster is warm, a cold cell on Spark costs little more than the same cell here
    (issue 77: the barrier stage, the rendezvous and the executors' ranks on its path)."""
    check_slots(cluster, 4, wait=60)  # an executor killed by an earlier test is back
    launch = bench("launch")
    runs = {"spark": launch.cold_cell(2, "gloo"), "local": launch.cold_cell(-2, "gloo")}
    spark, local = bench("timing").in_turn(runs, 2).values()
    SPARK_CELL.judge(spark / local, record_property, f" ({spark:.2f} s, {local:.2f} s)")


def test_guard_spark_live_cell(ip, cluster, record_property):
    """Once started, Spark is not on a live cell's path (a Spark launcher's deaths asked Spark
    twice a cell: issue 77). Against a cold cell of the same ``1`` on the same cluster."""
    check_slots(cluster, 4, wait=60)
    trivial, cold = bench("session").live_against_cold(ip, 2, repeat=20, cold_repeat=2)
    SPARK_LIVE_CELL.judge(trivial / cold, record_property, f" ({trivial:.1f} ms, {cold:.0f} ms)")
