from __future__ import annotations

import socket

import pytest

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
        "hostname": "hvd-host-0",
        "rank": 1, "size": 4, "local_rank": 1, "local_size": 2, "cross_rank": 0, "cross_size": 2,
    }  # fmt: skip
    assert plan["slots"]["1"]["rank"] == 2


def test_gpu_for_local_rank():
    from hvd_magic.worker import gpu_for_local_rank

    assert gpu_for_local_rank('[["0"], ["1"]]', 1) == "1"
    assert gpu_for_local_rank('[["0", "1"], ["2", "3"]]', 1) == "2,3"
    assert gpu_for_local_rank(None, 0) is None
    assert gpu_for_local_rank("[[]]", 0) is None


def test_gloo_store_keeps_horovods_semantics():
    from hvd_magic.launch.rendezvous import GlooStore, gloo_slots

    store = GlooStore(gloo_slots([("h0", 2), ("h1", 2)]))
    assert store.request("GET", "/global/0") == (404, b"")
    assert store.request("PUT", "/global/0", b"addr-0") == (200, b"")
    assert store.request("GET", "/global/0") == (200, b"addr-0")
    assert store.request("GET", "/global") == (400, b"")
    assert store.request("GET", "/a/b/c") == (400, b"")
    assert store.request("POST", "/global/0") == (405, b"")
    # A planned scope is cleared once all of its ranks said they finished, not before.
    for rank in range(3):
        store.request("DELETE", f"/global/{rank}")
    assert store.request("GET", "/global/0") == (200, b"addr-0")
    store.request("DELETE", "/global/3")
    assert store.request("GET", "/global/0") == (404, b"")
    store.request("PUT", "/local_h1/1", b"x")
    store.request("DELETE", "/local_h1/0")
    assert store.request("GET", "/local_h1/1") == (200, b"x")
    store.request("DELETE", "/local_h1/1")
    assert store.request("GET", "/local_h1/1") == (404, b"")
    # Scopes the ranks make up (process sets) lose just the deleted key.
    store.request("PUT", "/set_ab/k1", b"1")
    store.request("PUT", "/set_ab/k2", b"2")
    store.request("DELETE", "/set_ab/k1")
    assert store.request("GET", "/set_ab/k1")[0] == 404 and store.request("GET", "/set_ab/k2") == (200, b"2")


PROBE = """
import http.client, sys
connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10)
connection.request(sys.argv[2], sys.argv[3], body=sys.argv[4].encode() if len(sys.argv) > 4 else None)
print(connection.getresponse().status, flush=True)
"""


def test_gloo_store_serves_its_own_processes_only():
    import http.client
    import subprocess
    import sys

    from hvd_magic.launch.rendezvous import GlooStore, LoopbackStoreServer, gloo_slots

    def probe(*args: str) -> str:  # a child of this process: one of "our ranks"
        argv = [sys.executable, "-c", PROBE, str(server.port), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.strip()

    server = LoopbackStoreServer(GlooStore(gloo_slots([("localhost", 2)])).request)
    try:
        assert probe("PUT", "/global/0", "addr-0") == "200"
        assert probe("GET", "/global/0") == "200"
        # This process started the server but is not its own descendant: a stranger here,
        # like any other process on the host. Its well-formed request is closed unanswered.
        stranger = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        stranger.request("GET", "/global/0")
        try:
            answered = stranger.getresponse().status
        except (http.client.RemoteDisconnected, ConnectionResetError):
            answered = None
        assert answered is None and server.refused == 1
        # Nothing listens beyond loopback's 127.0.0.1.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", server.port), timeout=10)
        # Junk from one of ours gets an HTTP error, and the store goes on serving.
        junk = (
            "import socket, sys\n"
            "raw = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=10)\n"
            "raw.sendall(b'PUT /global/1 HTTP/1.1\\r\\nContent-Length: \\xff\\r\\n\\r\\n')\n"
            "print(raw.recv(100).split(b'\\r\\n')[0].decode())\n"
        )
        answer = subprocess.run(
            [sys.executable, "-c", junk, str(server.port)], capture_output=True, text=True, timeout=60
        )
        assert answer.stdout.startswith("HTTP/1.0 411"), answer
        too_big = junk.replace("\\xff", str(1 << 30))
        answer = subprocess.run(
            [sys.executable, "-c", too_big, str(server.port)], capture_output=True, text=True, timeout=60
        )
        assert answer.stdout.startswith("HTTP/1.0 413"), answer
        assert probe("GET", "/global/0") == "200"
    finally:
        server.close()


def test_mpirun_reports_name_the_rank_that_ended_first():
    """Open MPI 4.1's own words, as seen in runs here."""
    from hvd_magic.launch import death_of, mpirun_deaths

    signal_report = "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
    assert mpirun_deaths(signal_report) == [death_of(1, -9, "vm")]
    assert "signal 9 (SIGKILL)" in death_of(1, -9).what and "out-of-memory" in death_of(1, -9).what
    improper = "mpirun has exited due to process rank 3 with PID 0 on\nnode hvd-host-1 exiting improperly."
    [found] = mpirun_deaths(improper)
    assert (found.rank, found.host) == (3, "hvd-host-1") and "os._exit" in found.what
    code = "The first process to do so was:\n\n  Process name: [[5860,1],2]\n  Exit code:    3\n"
    assert mpirun_deaths(code) == [death_of(2, 3)]
    assert mpirun_deaths("Primary job  terminated normally") == []
