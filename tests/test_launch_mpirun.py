"""mpirun's command line and what its report says (pure)."""

from __future__ import annotations

from hvd_magic.launch.mpirun import idle_wait_env, lost_node, mpirun_argv, mpirun_deaths, tcp_interface_env
from hvd_magic.launch.processes import death_of


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


def test_ranks_waiting_in_mpi_yield_the_core_unless_the_run_chose():
    assert idle_wait_env({"PATH": "/bin"}) == {"OMPI_MCA_mpi_yield_when_idle": "1"}
    assert idle_wait_env({"OMPI_MCA_mpi_yield_when_idle": "0"}) == {}  # the user's: left as it is


def test_a_hosts_ranks_keep_to_its_interface_unless_the_run_chose_one():
    assert tcp_interface_env("eth1", {"PATH": "/bin"}) == {"OMPI_MCA_btl_tcp_if_include": "eth1"}
    assert tcp_interface_env("eth1", {"OMPI_MCA_btl_tcp_if_include": "ib0"}) == {}  # the user's
    assert tcp_interface_env("", {}) == {}  # an address no interface holds here (a host name)


def test_mpirun_reports_name_the_rank_that_ended_first():
    """Open MPI 4.1's own words, as seen in runs here."""
    signal_report = "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
    assert mpirun_deaths(signal_report) == [death_of(1, -9, "vm")]
    assert (
        "signal 9 (SIGKILL)" in death_of(1, -9).what
        and "out-of-memory killer is unknown" in death_of(1, -9).what
    )
    improper = "mpirun has exited due to process rank 3 with PID 0 on\nnode hvd-host-1 exiting improperly."
    [found] = mpirun_deaths(improper)
    assert (found.rank, found.host) == (3, "hvd-host-1") and "os._exit" in found.what
    code = "The first process to do so was:\n\n  Process name: [[5860,1],2]\n  Exit code:    3\n"
    assert mpirun_deaths(code) == [death_of(2, 3)]
    assert mpirun_deaths("Primary job  terminated normally") == []


def test_a_lost_host_is_named_by_mpiruns_report_or_by_our_rsh_clients():
    """Open MPI 4's node-died report, and the line our rsh client prints when the exec agent on
    a host goes quiet (a host cut off: no connection breaks, nothing else is said)."""
    assert lost_node("  Remote daemon: [[36402,0],3] on node hvd-host-2") == "hvd-host-2"
    quiet = "hvd_magic: the exec agent on hvd-host-1 at tcp://10.0.0.2:4000 stopped answering for 15 s"
    assert lost_node(quiet) == "hvd-host-1"
    assert lost_node("  HNP daemon   : [[36402,0],0] on node hvd-host-0") is None
