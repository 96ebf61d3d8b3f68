from __future__ import annotations

from hvd_magic.launch import thread_budget_env
from hvd_magic.launch.local import mpirun_argv


def test_mpirun_argv_local():
    assert mpirun_argv(2, ["python", "-m", "w"], as_root=True) == [
        "mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "none", "--map-by", "slot",
        "--mca", "pml", "ob1", "--mca", "rtc_hwloc_vmhole", "none",
        "--oversubscribe", "--mca", "btl", "self,vader", "python", "-m", "w",
    ]  # fmt: skip


def test_mpirun_argv_hosts_and_agent_never_use_horovodrun_btl_flag():
    argv = mpirun_argv(
        4, ["w"], hosts=[("10.0.0.1", 2), ("10.0.0.2", 2)], rsh_agent="agent", export_env=["A"]
    )
    assert argv[argv.index("-H") + 1] == "10.0.0.1:2,10.0.0.2:2"
    assert argv[argv.index("plm_rsh_agent") + 1] == "agent"
    assert argv[argv.index("-x") + 1] == "A"
    assert "^openib" not in argv and "--allow-run-as-root" not in argv


def test_thread_budget_divides_cores_among_local_ranks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = thread_budget_env(local_ranks=2, cores=8, user_env={})
    assert env["OMP_NUM_THREADS"] == "4" and env["TF_NUM_INTRAOP_THREADS"] == "4"
    assert thread_budget_env(local_ranks=4, cores=2, user_env={})["OMP_NUM_THREADS"] == "1"
    assert thread_budget_env(local_ranks=2, cores=8, user_env={"OMP_NUM_THREADS": "3"}) == {}


def test_spark_plan_groups_tasks_by_executor_and_numbers_ranks_host_by_host():
    from hvd_magic.launch.spark import make_plan

    tasks = [
        (0, "a:1", "10.0.0.1", 0),
        (1, "b:1", "10.0.0.2", 0),
        (2, "a:1", "10.0.0.1", 1),
        (3, "b:1", "10.0.0.2", 1),
    ]
    joins = [
        {"partition": p, "executor": e, "ip": ip, "gpus": [str(g)], "agent": f"tcp://{ip}:1"}
        for p, e, ip, g in tasks
    ]
    plan = make_plan(list(reversed(joins)), "gloo")
    assert [(h["token"], h["partitions"], h["gpus"]) for h in plan["hosts"]] == [
        ("hvd-host-0", [0, 2], [["0"], ["1"]]),
        ("hvd-host-1", [1, 3], [["0"], ["1"]]),
    ]
    assert plan["mpirun_partition"] == 0
    assert plan["slots"]["2"] == {
        "rank": 1, "size": 4, "local_rank": 1, "local_size": 2, "cross_rank": 0, "cross_size": 2,
    }  # fmt: skip
    assert plan["slots"]["1"]["rank"] == 2


def test_gpu_for_local_rank():
    from hvd_magic.worker import gpu_for_local_rank

    assert gpu_for_local_rank('[["0"], ["1"]]', 1) == "1"
    assert gpu_for_local_rank('[["0", "1"], ["2", "3"]]', 1) == "2,3"
    assert gpu_for_local_rank(None, 0) is None
    assert gpu_for_local_rank("[[]]", 0) is None


def test_gloo_rendezvous_serves_only_the_run_hosts():
    import http.client

    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    from hvd_magic.launch.rendezvous import start_rendezvous

    server = start_rendezvous("127.0.0.1", {"127.0.0.1"}, get_host_assignments(parse_hosts("localhost:2"), 2))
    port = server.server_address[1]
    try:
        allowed = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=("127.0.0.1", 0))
        allowed.request("GET", "/global/missing")
        assert allowed.getresponse().status == 404  # the store answered: no such key yet
        stranger = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=("127.0.0.2", 0))
        stranger.request("GET", "/global/missing")
        try:
            answered = stranger.getresponse().status
        except (http.client.RemoteDisconnected, ConnectionResetError):
            answered = None
        assert answered is None  # closed before a byte was read
    finally:
        server.shutdown()
        server.server_close()
