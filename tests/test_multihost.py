"""The multi-host bed (``tests.multihost``): a notebook on its own host runs a cell on three
other hosts, each with its own name, address and disk."""

from __future__ import annotations

import ast
import os
import re
import signal
import threading
import time
import uuid

import pytest

from hvd_magic.protocol.files import checkpoint_name

from . import multihost_cells as cells
from .multihost import DRIVER, MASTER, WORKERS, Cluster
from .multihost_faults import (
    files_left,
    host_processes,
    kill_host,
    restart_worker,
    set_link,
    wait_for_file,
    wait_until_clean,
    wait_until_gone,
)
from .multihost_spark import app_cores, start_worker

pytestmark = pytest.mark.multihost


def test_a_cell_runs_on_three_hosts_with_their_own_names_addresses_and_disks(multihost: Cluster) -> None:
    kernel = multihost.kernel
    assert kernel is not None
    probe = f"/tmp/hvd_magic-bed-probe-{uuid.uuid4().hex[:8]}"
    assert kernel.run("%load_ext hvd_magic").status == "ok"
    outcome = kernel.run(cells.WHERE_AM_I.format(probe=probe), timeout=120)
    assert outcome.status == "ok", f"{outcome.ename}: {outcome.evalue}\n{''.join(outcome.shown)[-3000:]}"
    gathered, mpirun = ast.literal_eval(outcome.value)
    ranks = sorted(gathered, key=lambda rank: rank["rank"])
    assert sorted(rank["host"] for rank in ranks) == ["hostA", "hostB", "hostC"]
    for rank in ranks:  # each rank sees exactly its host's bed address, and its name resolves to it
        assert rank["ips"] == [multihost.ip(rank["host"])], rank
        assert rank["resolved"] == multihost.ip(rank["host"]), rank
    assert len(mpirun) == 1, mpirun  # this run's one mpirun, seen by rank 0 on its host
    argv, agents = mpirun[0]
    check_mpirun_hosts(multihost, argv, agents, [rank["host"] for rank in ranks])
    rank0_host = ranks[0]["host"]
    assert multihost.bed.run(rank0_host, ["cat", probe]).stdout == "written by rank 0"
    for host in {"hostA", "hostB", "hostC", "hostD"} - {rank0_host}:  # /tmp is each host's own
        assert not os.path.lexists(multihost.bed.seen_from(host, probe)), host
    on_the_notebook = kernel.run(f"import os\nos.path.exists({probe!r})")
    assert on_the_notebook.value == "False"
    multihost.bed.run(rank0_host, ["rm", probe])  # a bed brought up by hand outlives the test
    assert files_left(multihost.bed, WORKERS) == {}  # Open MPI's directories went with the run


def check_mpirun_hosts(multihost: Cluster, argv: list[str], agents: dict[str, str], hosts: list[str]) -> None:
    """mpirun's host list (``-H``) names three hosts of one slot each, mapped by slot (rank i on
    the i-th), and the exec agent that starts rank i's daemon listens on rank i's host."""
    listed = argv[argv.index("-H") + 1].split(",")
    assert [entry.rsplit(":", 1)[1] for entry in listed] == ["1", "1", "1"], argv
    assert argv[argv.index("--map-by") + 1] == "slot", argv
    names = [entry.rsplit(":", 1)[0] for entry in listed]
    assert len(set(names)) == 3, argv
    agent_ips = [agents[name].split("//")[-1].rsplit(":", 1)[0] for name in names]
    assert agent_ips == [multihost.ip(host) for host in hosts], (argv, agents)


def test_torch_ranks_run_on_the_three_hosts(multihost: Cluster) -> None:
    kernel = multihost.kernel
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    outcome = kernel.run(cells.TORCH_HOSTS, timeout=180)
    assert outcome.value == "['hostA', 'hostB', 'hostC']", f"{outcome.ename}: {outcome.evalue}"


def test_gloo_ranks_read_their_data_shards_where_their_hosts_tasks_wrote_them(multihost: Cluster) -> None:
    kernel = multihost.kernel
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    assert kernel.run("bed_df = spark.range(0, 300, numPartitions=5)").status == "ok"
    outcome = kernel.run(cells.GLOO_SHARDS, timeout=180)
    assert outcome.status == "ok", f"{outcome.ename}: {outcome.evalue}"
    ranks = ast.literal_eval(outcome.value)
    assert [rank[0] for rank in ranks] == ["hostA", "hostB", "hostC"]
    assert sorted(i for rank in ranks for i in rank[1]) == list(range(300))
    for host, ids, writer, path in ranks:
        assert len(ids) == 100, (host, len(ids))
        assert writer.rsplit(":", 1)[0] == multihost.ip(host), (host, writer)  # written on its host
        for other in {"hostA", "hostB", "hostC", "hostD"} - {host}:  # and seen nowhere else
            assert not os.path.lexists(multihost.bed.seen_from(other, path)), (other, path)
    assert files_left(multihost.bed, WORKERS) == {}


def test_the_timeline_is_written_on_rank_0s_host_and_arrives_whole_on_the_notebooks(
    multihost: Cluster,
) -> None:
    kernel = multihost.kernel
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    ran = kernel.run(cells.SLOW_RANK_2, timeout=180)
    assert ran.status == "ok", f"{ran.ename}: {ran.evalue}"
    ranks = ast.literal_eval(ran.value)
    assert [rank[:2] for rank in ranks] == [[0, True], [1, False], [2, False]]  # on rank 0's host only
    # the analysis shown under the cell names the straggler's host (the timeline names ranks only)
    assert f"rank 2 on {ranks[2][2]} was the last to be ready" in "".join(ran.shown), ran.shown[-3:]
    assert files_left(multihost.bed, WORKERS) == {}  # ... and gone from there after the run
    whole = kernel.run("import json, os\nlen(json.load(open('bed_timeline.json'))), os.getcwd()")
    count, folder = ast.literal_eval(whole.value)
    assert count > 60  # strict JSON, every allreduce's events
    for host in ("hostA", "hostB", "hostC"):  # not in any rank host's working folder
        assert not os.path.lexists(multihost.bed.seen_from(host, f"{folder}/bed_timeline.json")), host


def test_a_live_session_spans_the_three_hosts(multihost: Cluster) -> None:
    kernel = multihost.kernel
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    started = kernel.run("%horovod start np=3", timeout=180)
    assert any("3 ranks on 3 hosts (hostA, hostB, hostC)" in text for text in started.shown), started
    try:
        assert kernel.run("%%horovod\nimport socket\nme = socket.gethostname()").status == "ok"
        names = kernel.run("%%horovod\nsorted(hvd.allgather_object(me))")
        assert names.value == "['hostA', 'hostB', 'hostC']", names
        stacks = "".join(kernel.run("%horovod stacks").shown)  # each rank asked on its own host
        assert "ranks 0, 1, 2 on hostA, hostB, hostC: idle" in stacks, stacks
    finally:
        assert kernel.run("%horovod stop").status == "ok"


def test_a_rank_whose_python_cannot_run_is_dumped_by_py_spy_on_its_own_host(multihost: Cluster) -> None:
    """At the timeout, rank 1 (on another host than the notebook's) is in a C call that holds
    Python's lock: the Spark task it runs under dumps it with py-spy there and sends the dump back;
    the notebook, on its own host, could not have."""
    kernel = multihost.kernel
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    outcome = kernel.run(cells.HOLDS_THE_LOCK, timeout=240)
    assert outcome.status == "error" and outcome.ename == "RunTimeout", outcome
    said = outcome.evalue
    assert re.search(
        r"^rank 1 on host[ABC]: no answer from its Python \(a C call holds its lock\); py-spy", said, re.M
    )
    assert "sleep (libc" in said and "<horovod cell>:5" in said, said  # the line under the magic's
    assert wait_until_gone(multihost.bed) == []


def test_an_estimators_model_dir_lives_on_the_notebooks_host_only(multihost: Cluster) -> None:
    """Checkpoints and the exported model arrive in model_dir on the driver's host (no executor
    sees it); a second fit resumes from them; the Transformer runs on the executors."""
    kernel, bed = multihost.kernel, multihost.bed
    model_dir = f"/tmp/hvd_magic-bed-model-{uuid.uuid4().hex[:8]}"
    assert kernel is not None
    outcome = kernel.run(cells.ESTIMATOR_FITS.format(model_dir=model_dir), timeout=300)
    assert outcome.status == "ok", f"{outcome.ename}: {outcome.evalue}\n{''.join(outcome.shown)[-3000:]}"
    after_first, after_second, exported, resumed, epochs, same = ast.literal_eval(outcome.value)
    assert after_first == [checkpoint_name(1)]
    assert after_second == [checkpoint_name(1), checkpoint_name(2)] and exported
    assert resumed and epochs == 2  # epoch 1 came from the first fit's checkpoint
    assert same  # the executors' predictions are the fitted network's
    for host in WORKERS:  # model_dir is the driver's own: no executor's host has it
        assert not os.path.lexists(bed.seen_from(host, model_dir)), host
    kernel.run(f"import shutil\nshutil.rmtree({model_dir!r})")


def test_the_notebooks_second_interface_that_no_executor_reaches(multihost: Cluster) -> None:
    """The address chosen is the one the executors reach; one they cannot reach, set by hand,
    fails at once with an error that says where it tried and how to choose another."""
    kernel, bed = multihost.kernel, multihost.bed
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    other = "ip link add other0 type veth peer name other1 && ip addr add 192.0.2.14/24 dev other0"
    other += " && ip link set other1 up && ip link set other0 up"  # a second network, no executor on it
    assert bed.run(DRIVER, ["sh", "-c", other]).returncode == 0
    try:
        chosen = kernel.run(
            "from hvd_magic.launch.spark_session import driver_address\ndriver_address(spark)"
        )
        assert chosen.value == repr(multihost.ip(DRIVER)), chosen
        assert kernel.run("import os\nos.environ['HVD_MAGIC_DRIVER_HOST'] = '192.0.2.14'").status == "ok"
        outcome = kernel.run("%%horovod np=3\n1", timeout=120)
    finally:
        kernel.run("os.environ.pop('HVD_MAGIC_DRIVER_HOST', None)")
        bed.run(DRIVER, ["ip", "link", "del", "other0"])
    assert outcome.status == "error", outcome
    assert "cannot reach the notebook at 192.0.2.14:" in outcome.evalue, outcome.evalue
    assert "HVD_MAGIC_DRIVER_HOST" in outcome.evalue, outcome.evalue


def forget_rank_files(multihost: Cluster) -> None:
    for name in WORKERS:
        multihost.bed.run(name, ["sh", "-c", "rm -f /tmp/hvd_magic-bed-rank-*"])


def victim(multihost: Cluster) -> tuple[str, int]:
    """Once the ranks run: a host with a rank that runs neither Spark's master nor mpirun (rank
    0's host), and that rank."""
    bed = multihost.bed
    rank0 = wait_for_file(bed, WORKERS, "/tmp/hvd_magic-bed-rank-0", timeout=150)
    host = next(name for name in WORKERS if name not in (MASTER, rank0))
    listed = "ls /tmp/hvd_magic-bed-rank-* 2>/dev/null"
    deadline = time.monotonic() + 60
    while not (found := bed.run(host, ["sh", "-c", listed]).stdout.split()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert found, f"no rank wrote its file on {host} within 60 s"
    return host, int(found[0].rsplit("-", 1)[1])


def test_a_host_cut_off_mid_run_is_named_with_the_notebooks_address_within_30_s(multihost: Cluster) -> None:
    kernel, bed = multihost.kernel, multihost.bed
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    forget_rank_files(multihost)
    cut: list[tuple[str, int, float]] = []

    def cut_a_host() -> None:
        host, rank = victim(multihost)
        set_link(host, up=False)
        cut.append((host, rank, time.monotonic()))

    cutter = threading.Thread(target=cut_a_host, daemon=True)
    cutter.start()
    try:
        outcome = kernel.run(cells.KEEPS_RUNNING, timeout=240)
        ended = time.monotonic()
        cutter.join(timeout=30)
    finally:
        for name in WORKERS:
            set_link(name, up=True)
    ((host, rank, at),) = cut
    print(f"cut {host} off; the cell ended {ended - at:.1f} s later: {outcome.evalue}")
    assert outcome.status == "error", outcome
    assert f"rank {rank} on {host}" in outcome.evalue and multihost.ip(host) in outcome.evalue, outcome.evalue
    assert f"notebook at {multihost.ip(DRIVER)}:" in outcome.evalue, outcome.evalue
    assert ended - at <= 30
    # Once the host is back: its task hears the stop, and nothing of the run is left anywhere.
    assert wait_until_gone(bed, timeout=90) == []
    assert wait_until_clean(bed, WORKERS, timeout=90) == {}
    forget_rank_files(multihost)


def test_a_host_killed_mid_run_is_named_its_others_stopped_and_with_retries_the_run_resumes(
    multihost: Cluster,
) -> None:
    """A spot host reclaimed: every process of a host killed after the run's checkpoint at step
    10 reached the notebook's host. Its rank is named with the host, the other hosts' ranks are
    stopped (a killed task cleans nothing up), its worker comes back, and the run's second
    attempt waits for the slots, resumes from the latest checkpoint and ends as if never killed;
    its task on the host that came back removes what the killed one left."""
    kernel, bed = multihost.kernel, multihost.bed
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    forget_rank_files(multihost)
    store = f"/tmp/hvd_magic-bed-checkpoints-{uuid.uuid4().hex[:8]}"  # the notebook's host's own
    killed: list[tuple[str, int, float, list[str], dict[str, list[str]], dict[str, list[str]]]] = []

    def reclaim_a_host() -> None:
        host, rank = victim(multihost)
        wait_for_file(bed, [DRIVER], f"{store}/{checkpoint_name(10)}", timeout=120)
        kill_host(bed, host)
        at = time.monotonic()
        # no second attempt before the worker is back (it needs all 3 slots): what the first left
        others_left = wait_until_gone(bed, timeout=60)
        stopped = time.monotonic() - at
        others = files_left(bed, [name for name in WORKERS if name != host])
        killed.append((host, rank, stopped, others_left, others, files_left(bed, [host])))
        forget_rank_files(multihost)
        start_worker(bed, host, multihost.master_url, 1, multihost.log_dir)

    reclaimer = threading.Thread(target=reclaim_a_host, daemon=True)
    reclaimer.start()
    outcome = kernel.run(cells.RESUMES.format(store=store), timeout=400)
    reclaimer.join(timeout=60)
    assert outcome.status == "ok", f"{outcome.ename}: {outcome.evalue}\n{''.join(outcome.shown)[-3000:]}"
    ((host, rank, stopped, others_left, others_files, host_files),) = killed
    print(f"killed {host}; the other hosts' ranks were stopped {stopped:.1f} s later")
    assert others_left == [] and stopped < 60  # the other hosts' ranks and daemons were stopped
    assert others_files == {} and host_files  # a killed task cleans nothing up ...
    total, resumed_from, hosts = ast.literal_eval(outcome.value)
    assert total == 3.0 * 60 and resumed_from >= 10 and hosts == ["hostA", "hostB", "hostC"]
    said = [line for line in "".join(outcome.shown).splitlines() if "attempt 2 of 2 from step" in line]
    assert said and f"from step {resumed_from}" in said[0], said
    assert f"rank {rank} on {host}" in said[0] and multihost.ip(host) in said[0], said
    assert wait_until_gone(bed) == []
    assert files_left(bed, WORKERS) == {}  # ... the next task on its host removes what it left
    forget_rank_files(multihost)
    kernel.run(f"import shutil\nshutil.rmtree({store!r})")


def test_min_np_goes_on_with_two_ranks_after_a_host_is_lost_and_grows_back_to_three(
    multihost: Cluster,
) -> None:
    """Elastic: a host killed for good (no free slot elsewhere): after resize_wait the run goes
    on with the 2 slots there are, from the last checkpoint, hvd.size() 2 and resized() (3, 2);
    the host's worker comes back: at the next checkpoint the run stops and starts again with 3,
    from that checkpoint, and finishes. No step is counted twice and none goes back further than
    one checkpoint interval."""
    kernel, bed = multihost.kernel, multihost.bed
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    forget_rank_files(multihost)
    store = f"/tmp/hvd_magic-bed-checkpoints-{uuid.uuid4().hex[:8]}"
    lost: list[str] = []
    back: list[bool] = []  # whether the host's worker and executor were back before the gate opened

    def lose_a_host_then_bring_it_back() -> None:
        host, _ = victim(multihost)
        wait_for_file(bed, [DRIVER], f"{store}/{checkpoint_name(10)}", timeout=120)
        kill_host(bed, host)
        lost.append(host)
        forget_rank_files(multihost)
        others = [name for name in WORKERS if name != host]
        wait_for_file(bed, others, "/tmp/hvd_magic-bed-rank-1", timeout=120)  # the smaller attempt runs
        start_worker(bed, host, multihost.master_url, 1, multihost.log_dir)
        deadline = time.monotonic() + 240  # a worker and its executor's JVM, on a loaded machine
        while app_cores(multihost.ip(MASTER)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        back.append(app_cores(multihost.ip(MASTER)) >= 3)
        for name in WORKERS:
            bed.run(name, ["touch", cells.GATE])

    thread = threading.Thread(target=lose_a_host_then_bring_it_back, daemon=True)
    thread.start()
    try:
        outcome = kernel.run(cells.ELASTIC.format(store=store, gate=cells.GATE), timeout=600)
        thread.join(timeout=60)
        shown = "".join(outcome.shown)
        assert back == [True], f"the lost host's worker was not back in 240 s (the bed's): {shown[-2000:]}"
        assert outcome.status == "ok", f"{outcome.ename}: {outcome.evalue}\n{shown[-3000:]}"
        total, sizes, hosts = ast.literal_eval(outcome.value)
        assert total == 120.0 and hosts == ["hostA", "hostB", "hostC"]  # every step once
        (first, full), (shrunk, smaller), (grown, again) = [(s, (n, r)) for s, n, r in sizes]
        assert (first, full) == (0, (3, None)) and smaller == (2, (3, 2)) and again == (3, (2, 3)), sizes
        assert 10 <= shrunk < grown and shrunk % 5 == 0 and grown % 5 == 0, sizes  # from checkpoints
        assert (
            "3 → 2 ranks: " in shown and "rank" in shown and "2 → 3 ranks: the cluster has the slots" in shown
        )
    finally:
        for name in WORKERS:
            bed.run(name, ["rm", "-f", cells.GATE])
        kernel.run(f"import shutil\nshutil.rmtree({store!r}, ignore_errors=True)")
    assert wait_until_gone(bed) == []
    forget_rank_files(multihost)


def test_a_decommissioned_worker_preempts_the_run_with_no_step_lost_and_min_np_goes_on(
    multihost: Cluster,
) -> None:
    """SIGPWR to a host's Spark worker (spark.decommission.enabled), as a spot reclaim or a
    scale-down sends it: the ranks hear the notice at their next stopping(), checkpoint there and
    stop; the next attempt finds the host's slot gone (a decommissioned worker gets no executor)
    and goes on with 2 ranks from that very step."""
    kernel, bed = multihost.kernel, multihost.bed
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    forget_rank_files(multihost)
    store = f"/tmp/hvd_magic-bed-checkpoints-{uuid.uuid4().hex[:8]}"
    noticed: list[str] = []

    def decommission_a_worker() -> None:
        host, _ = victim(multihost)
        worker = next(p for p in host_processes(bed, host) if "deploy.worker.Worker" in " ".join(p.cmdline()))
        worker.send_signal(signal.SIGPWR)
        noticed.append(host)

    thread = threading.Thread(target=decommission_a_worker, daemon=True)
    thread.start()
    try:
        outcome = kernel.run(cells.PREEMPTED.format(store=store), timeout=400)
        thread.join(timeout=60)
        shown = "".join(outcome.shown)
        assert outcome.status == "ok", f"{outcome.ename}: {outcome.evalue}\n{shown[-3000:]}"
        total, starts = ast.literal_eval(outcome.value)
        (first, size), (stopped, smaller) = starts
        assert (first, size, smaller) == (0, 3, 2) and stopped > 0, starts
        assert total == stopped + 20  # every step once: none lost past the notice, none twice
        assert "preemption notice: Spark is decommissioning executor" in shown, shown[-3000:]
        assert "3 → 2 ranks: executor or host lost: preempted: " in shown
    finally:
        kernel.run(f"import shutil\nshutil.rmtree({store!r}, ignore_errors=True)")
        for host in noticed:  # a decommissioned worker does not come back by itself
            kill_host(bed, host)
            restart_worker(multihost, host, 3)
    assert wait_until_gone(bed) == []
    forget_rank_files(multihost)


# Last in the module: it kills the notebook's kernel (the fixture's teardown finds it gone).
def test_a_dead_notebook_is_noticed_by_every_rank_on_every_host_within_5_s(multihost: Cluster) -> None:
    """The notebook's process dies while the Spark driver lives on (as a Spark Connect server or
    a managed cluster's driver does; here the kernel's own driver JVM is held stopped, so that
    Spark stops nothing): the kernel's sockets close, and every rank of its live session on the
    three hosts sees its connection to the notebook close and exits, where 20 s of missed beats
    would pass first."""
    kernel, bed = multihost.kernel, multihost.bed
    assert kernel is not None and kernel.run("%load_ext hvd_magic").status == "ok"
    started = kernel.run("%horovod start np=3", timeout=180)
    assert any("3 ranks on 3 hosts" in text for text in started.shown), started
    (python,) = [p for p in host_processes(bed, DRIVER) if "ipykernel_launcher" in " ".join(p.cmdline())]
    drivers = [p for p in python.children(recursive=True) if "java" in p.name()]
    assert drivers, "the kernel's Spark driver JVM was not found"
    try:
        for driver in drivers:
            driver.suspend()
        python.kill()
        killed = time.monotonic()
        left = wait_until_gone(bed, timeout=5)
        assert left == [], f"{time.monotonic() - killed:.1f} s after the kernel died: {left}"
        print(f"every rank gone {time.monotonic() - killed:.1f} s after the kernel died")
    finally:
        for driver in drivers:
            driver.kill()
