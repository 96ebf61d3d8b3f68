from __future__ import annotations

from hvd_magic.launch import thread_budget_env
from hvd_magic.launch.local import mpirun_argv


def test_mpirun_argv_local():
    assert mpirun_argv(2, ["python", "-m", "w"], as_root=True) == [
        "mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "none", "--map-by", "slot",
        "--mca", "pml", "ob1", "--oversubscribe", "--mca", "btl", "self,vader", "python", "-m", "w",
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
