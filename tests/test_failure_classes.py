"""Failures named by their class, caused for real: a rank the kernel's OOM killer takes inside a
memory cgroup with a limit (as a container or a YARN/Kubernetes executor has), read from what the
kernel counts, not guessed from the SIGKILL; a crash on a signal; a kill from outside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

from hvd_magic import FailureClass, RankFailedError
from hvd_magic.launch.memory_cgroup import MemoryWatch
from hvd_magic.launch.processes import death_of
from hvd_magic.options import make_options
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks

from .helpers import RecordingView, fork_servers_of, leftover_processes
from .kernels import Kernel

LIMIT = 1200 * 2**20  # room for the kernel and two torch ranks, not for rank 1's allocations

# Rank 1 allocates slowly (the notebook asks each rank for its memory every second, so it has
# reported some before the kill) until the kernel's OOM killer takes it; it offers itself as the
# victim, as the process using the most memory would be. Rank 0 waits for it in a collective.
OOM_CELL = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    with open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("1000")
    hoard = []
    while len(hoard) < 160:                     # 4 GiB: far past the limit, far from the machine's
        hoard.append(bytearray(25 * 2**20))     # pages touched: charged to the cgroup
        time.sleep(0.2)
    raise MemoryError("4 GiB allocated: the memory cgroup's limit did not hold this rank")
dist.all_reduce(torch.ones(1))
"""


def _own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v1 or v2), where a child may be made; else None."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return directory if (directory / "memory.limit_in_bytes").exists() else None
        if number == "0" and not controllers:
            directory = Path("/sys/fs/cgroup") / path.lstrip("/")
            controllers_file = directory / "cgroup.subtree_control"
            if controllers_file.exists() and "memory" in controllers_file.read_text().split():
                return directory
    return None


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A child memory cgroup with a limit of LIMIT bytes, removed afterwards."""
    parent = _own_memory_cgroup()
    if parent is None or os.geteuid() != 0:
        pytest.skip("needs root and a writable memory cgroup (v1 memory controller, or v2 with memory)")
    group = parent / f"hvd_magic-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    limit_file = "memory.limit_in_bytes" if (group / "memory.limit_in_bytes").exists() else "memory.max"
    (group / limit_file).write_text(str(LIMIT))
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # gone meanwhile
        group.rmdir()


def test_a_process_killed_by_the_oom_killer_is_told_from_one_killed_from_outside(memory_cgroup):
    grow = "x = []\nwhile True: x.append(bytearray(50 * 2**20))"
    process = subprocess.Popen(
        [sys.executable, "-c", grow],
        preexec_fn=lambda: (memory_cgroup / "cgroup.procs").write_text(str(os.getpid())),
    )
    watch = MemoryWatch.of(process.pid)
    assert process.wait(timeout=120) == -signal.SIGKILL
    death = death_of(1, process.returncode, memory=watch)
    assert death.failure is FailureClass.OOM, death
    assert f"the memory cgroup /{memory_cgroup.name}" in death.what or memory_cgroup.name in death.what
    assert "its limit of 1,200 MiB" in death.what
    # a SIGKILL from outside in the same cgroup: its counter did not move
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        preexec_fn=lambda: (memory_cgroup / "cgroup.procs").write_text(str(os.getpid())),
    )
    watch = MemoryWatch.of(sleeper.pid)
    sleeper.kill()
    killed = death_of(1, sleeper.wait(timeout=60), memory=watch)
    assert killed.failure is FailureClass.KILLED and killed.what == "was killed by signal 9 (SIGKILL)"


def test_a_rank_taken_by_the_oom_killer_is_named_with_its_limit_and_not_retried(memory_cgroup, tmp_path):
    """A notebook's kernel in a container with a memory limit: rank 1 allocates past it. Its
    ranks are warm, forked from a server that started before the kernel was put in the cgroup:
    a rank takes its stand-in's cgroup, where the launcher looks."""
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    kernel = Kernel(manager, client)
    try:
        assert kernel.run("%load_ext hvd_magic").status == "ok"
        assert kernel.run("%%horovod np=-2 backend=torch\nimport torch\n").status == "ok"  # the server
        (memory_cgroup / "cgroup.procs").write_text(str(manager.provisioner.process.pid))
        kernel_process = psutil.Process(manager.provisioner.process.pid)
        servers = [p.pid for p in fork_servers_of(kernel_process.pid)]
        limited = (memory_cgroup / "cgroup.procs").read_text().split()
        assert servers and not set(map(str, servers)) & set(limited)  # outside the limit
        outcome = kernel.run("%%horovod np=-2 backend=torch retries=1\n" + OOM_CELL, timeout=240)
        assert outcome.ename == "RankFailedError", outcome
        first = outcome.evalue.splitlines()[0]
        assert (
            first.startswith("rank 1 on ")
            and " failed (out of memory): it was killed by the kernel's" in first
        )
        assert "its limit of 1,200 MiB" in first and "its last reported memory: " in first
        assert "rank 0 then failed because of it" in first
        said = "".join(outcome.shown)
        assert "attempt 2" not in said  # an OOM is not retried, and the error says why
        check = kernel.run("import sys; e = sys.last_value; print(e.failure.name, e.__notes__)")
        assert "OOM" in "".join(check.shown) and "not retried (out of memory)" in "".join(check.shown)
        assert leftover_processes(psutil.Process(manager.provisioner.process.pid)) == []
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


CRASH_CELL = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    os.abort()                               # as a native library's assertion would
dist.all_reduce(torch.ones(1))
"""


def test_a_crash_on_a_signal_is_its_own_class_in_the_error_and_the_view_and_not_retried():
    view = RecordingView()
    with pytest.raises(RankFailedError) as info:
        run_on_ranks(pack_cell(CRASH_CELL, {}), make_options(np=-2, backend="torch", retries=1), view)
    assert info.value.failure is FailureClass.CRASH and info.value.rank == 1
    assert "failed (crashed): it was killed by signal 6 (SIGABRT); rank 0 then failed because of it" in str(
        info.value
    )
    assert any(note.startswith("not retried (crashed): ") for note in info.value.__notes__)
    assert f"hvd_magic: rank 1 on {info.value.host} failed (crashed)" in view.notices
    assert leftover_processes() == []
