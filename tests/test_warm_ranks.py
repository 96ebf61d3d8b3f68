"""Warm ranks: local ranks of PyTorch, TensorFlow or Keras code are forked from a server that
imported the framework once (``warm.choice``, ``warm.fork_server``, ``warm.stand_in``). What a
started rank would be, each is: its own random draws, its thread budget, its directory first on
sys.path, its command line, a namespace and ``sys.modules`` of its own code only (and of what
PyTorch imports on first use); and it ends
with its place in the launcher's tree. Local runs of no framework are forked from a server of
the rank's own modules only; runs that ask not to start the usual way."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

import hvd_magic.warm
from hvd_magic import RunError
from hvd_magic.launch.local import LocalGlooLauncher, LocalMpiLauncher, LocalTorchLauncher
from hvd_magic.options import make_options
from hvd_magic.protocol.env import ENV_FORK_SERVER
from hvd_magic.run.packing import pack_cell, pack_function
from hvd_magic.session.ranks import setup_imports
from hvd_magic.warm import stand_in
from hvd_magic.warm.choice import ENV_WARM_RANKS, warm_modules
from hvd_magic.warm.preloaders import identity, read_at_import
from hvd_magic.warm.servers import serving

from .helpers import STAND_IN, fork_servers_of, gone_within, leftover_processes, waiting_cell, when_started

SERVER = "hvd_magic.warm.fork_server"

# Each rank writes where it runs and what it sees into DIRECTORY/RANK.json.
WHERE = """
import gc, json, os, random, sys, torch
from hvd_magic.protocol.env import rank_from_env
rank = rank_from_env()[0]
def parent_of(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
def cmdline(pid):
    return [part for part in open(f"/proc/{pid}/cmdline").read().split("\\0") if part]
before = len(sys.modules)
torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)  # a first optimizer imports torch._dynamo
seen = {
    "optimizer_imports": len(sys.modules) - before,
    "dynamo_dir": torch._dynamo.config.debug_dir_root == os.path.join(os.getcwd(), "torch_compile_debug"),
    "pid": os.getpid(), "command": cmdline(os.getpid())[1:], "parent": cmdline(os.getppid()),
    "argv": sys.argv[1:] + sys.orig_argv[1:],
    "grandparent": parent_of(os.getppid()), "threads": torch.get_num_threads(),
    "budget": os.environ.get("OMP_NUM_THREADS"), "draw": random.random(),
    "path0": sys.path[0] == os.getcwd(), "foreign": sorted(set(globals()) & {"serve", "receive", "WORKER"}),
    "horovod": "horovod" in sys.modules, "collector": gc.isenabled(), "frozen": gc.get_freeze_count(),
    "env": {name: value for name, value in os.environ.items() if name.endswith("_HVD_TEST")},
}
open(os.path.join(DIRECTORY, f"{rank}.json"), "w").write(json.dumps(seen))
"""


def where(ip, tmp_path: Path, options: str = "np=-2", imports: str = "") -> list[dict]:
    folder = tmp_path / f"cell-{len(list(tmp_path.glob('cell-*')))}"
    folder.mkdir()
    ip.run_cell_magic("horovod", options, f"{imports}DIRECTORY = {str(folder)!r}\n" + WHERE)
    return [json.loads((folder / f"{rank}.json").read_text()) for rank in range(2)]


def servers() -> list[psutil.Process]:
    return fork_servers_of(os.getpid())


@pytest.mark.parametrize("launcher", ["launcher=mpi", "launcher=gloo", "backend=torch"])
def test_a_torch_cells_ranks_are_forked_from_one_server_and_are_what_started_ranks_would_be(
    ip, tmp_path, launcher
):
    first = where(ip, tmp_path, f"np=-2 {launcher}")
    second = where(ip, tmp_path, f"np=-2 {launcher}")
    (server,) = {seen["grandparent"] for seen in first + second}  # one server, kept for the next cell
    assert server in [p.pid for p in servers()]
    for seen in first + second:
        assert SERVER in " ".join(seen["parent"])  # forked (by the server's waiter)
        assert seen["command"] == ["-m", "hvd_magic.rank.worker"]  # as ps shows a started rank
        assert seen["argv"] == ["-m", "hvd_magic.rank.worker"]  # as it sees itself: no server's arguments
        assert seen["threads"] == int(seen["budget"]) == 1  # the budget, not the server's 2 cores
        assert seen["path0"] and seen["foreign"] == [] and not seen["horovod"]
        assert seen["optimizer_imports"] == 0  # the server imported what PyTorch's first use does
        assert seen["dynamo_dir"]  # read from the rank's directory, not from the server's
        # the collector runs, but never walks what the server imported (PyTorch: 290,000 objects)
        assert seen["collector"] and seen["frozen"] > 100_000, seen["frozen"]
    assert len({seen["draw"] for seen in first + second}) == 4  # random seeded afresh in each
    assert len({seen["pid"] for seen in first + second}) == 4


def test_a_frameworks_cells_share_one_server_whatever_their_launcher(ip, tmp_path):
    """The server preloads PyTorch, not Horovod's binding (the rank's own import, 0.02 CPU-s):
    a Horovod cell's ranks and a torch.distributed cell's come from the same server."""
    horovod = where(ip, tmp_path, "np=-2 launcher=gloo", imports="import horovod.torch\n")
    ddp = where(ip, tmp_path, "np=-2 backend=torch")
    assert all(seen["horovod"] for seen in horovod) and not any(seen["horovod"] for seen in ddp)
    (server,) = {seen["grandparent"] for seen in horovod + ddp}
    # a torch server of this kernel's (others this worker's earlier tests started may live on)
    assert server in [p.pid for p in servers() if "torch" in p.cmdline()]
    assert all(seen["optimizer_imports"] == 0 for seen in horovod + ddp)


def test_ranks_of_no_framework_are_forked_from_a_server_of_the_ranks_own_modules_only(ip, tmp_path):
    """A cell that imports no framework still spares each rank the start of Python and of
    hvd_magic's rank side (about 0.2 CPU-s and 0.1 s a rank here): its server imported those and
    nothing else, so the rank finds no framework in ``sys.modules``."""
    cell = (
        "import json, os, sys\nfrom hvd_magic.protocol.env import rank_from_env\n"
        "seen = {'parent': [p for p in open(f'/proc/{os.getppid()}/cmdline').read().split(chr(0)) if p],\n"
        "        'frameworks': sorted({'torch', 'tensorflow', 'keras'} & set(sys.modules)),\n"
        "        'argv': sys.argv[1:] + sys.orig_argv[1:],\n"
        "        'pid': os.getpid()}\n"
        f"open(os.path.join({str(tmp_path)!r}, str(rank_from_env()[0])), 'w').write(json.dumps(seen))\n"
    )
    seen = []
    for launcher in ("launcher=mpi", "launcher=gloo"):
        ip.run_cell_magic("horovod", f"np=-2 {launcher}", cell)
        seen += [json.loads((tmp_path / str(rank)).read_text()) for rank in (0, 1)]
    assert all(SERVER in " ".join(rank["parent"]) for rank in seen), seen  # forked, whatever the launcher
    assert {" ".join(rank["parent"][-1:]) for rank in seen} == {"hvd_magic.rank.worker"}  # its modules only
    assert all(rank["frameworks"] == [] and rank["argv"] == ["-m", "hvd_magic.rank.worker"] for rank in seen)
    assert len({rank["pid"] for rank in seen}) == 4


def test_a_rank_with_a_sitecustomize_of_its_own_starts_the_usual_way(tmp_path):
    """Python runs a sitecustomize on the rank's PYTHONPATH as the rank starts; a forked rank never
    would (its server started before): such ranks are not forked. (test_faults' start timeout runs
    one: its rank 1 sleeps in it.)"""
    worker = ("hvd_magic.rank.worker",)
    assert serving(worker, {"PYTHONPATH": str(tmp_path)}) is not None  # (the server is this process's)
    (tmp_path / "sitecustomize.py").write_text("")
    assert serving(worker, {"PYTHONPATH": f"/nonexistent{os.pathsep}{tmp_path}"}) is None


def test_servers_are_told_apart_by_an_edit_to_any_of_hvd_magics_modules_and_by_what_their_imports_read():
    """An edit in a checkout (a rank module's, say) changes no ``__init__``: a server of the old
    code is not used for the next run. A server of our modules only is not told apart by the
    frameworks' variables, which nothing it imports reads."""
    worker = ("hvd_magic.rank.worker",)
    before = identity(worker, {})
    module = Path(hvd_magic.warm.__file__)  # two lines no run imports anew
    times = module.stat()
    try:
        os.utime(module, (times.st_atime, time.time() + 3600))  # the newest of them
        assert identity(worker, {}) != before
    finally:
        os.utime(module, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert identity(worker, {}) == before
    assert read_at_import(worker, {"TORCH_HVD_TEST": "1", "LD_HVD_TEST": "2"}).keys() >= {"LD_HVD_TEST"}
    assert "TORCH_HVD_TEST" not in read_at_import(worker, {"TORCH_HVD_TEST": "1"})
    assert "TORCH_HVD_TEST" in read_at_import(("torch", *worker), {"TORCH_HVD_TEST": "1"})


def test_warm_ranks_can_be_turned_off(ip, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_WARM_RANKS, "0")
    cold = where(ip, tmp_path)
    assert all("mpirun" in seen["parent"] for seen in cold)
    assert all(seen["optimizer_imports"] > 100 for seen in cold)  # what a warm rank is spared
    assert all(seen["argv"] == ["-m", "hvd_magic.rank.worker"] for seen in cold)  # what a warm rank sees


def test_which_runs_are_warm_is_read_from_the_code():
    local, spark, worker = True, False, "hvd_magic.rank.worker"  # ranks here, or on Spark
    torch = ("torch", "torch._dynamo")  # what PyTorch imports on first use, with it
    assert warm_modules({"torch", "torch.nn"}, local) == (*torch, worker)
    # Horovod's binding: its framework, not the binding (the rank imports it: one server a framework)
    assert warm_modules({"horovod.torch", "torch"}, local) == (*torch, worker)
    assert warm_modules({"horovod.torch"}, local) == (*torch, worker)  # the binding imports its framework
    keras = ("tensorflow", worker)
    assert warm_modules({"tensorflow", "horovod.tensorflow.keras"}, local) == keras
    assert warm_modules({"horovod.keras"}, local) == ("keras", worker)
    assert warm_modules({"tensorflow", "keras.layers"}, local) == ("tensorflow", "keras", worker)
    assert warm_modules({"torch", "tensorflow"}, local) == (*torch, "tensorflow", worker)  # what it imports
    assert warm_modules({"jax", "torch"}, local) == ()  # JAX: not safe to fork once imported
    # the trainers, with the PyTorch they are built on (HF's Trainer is loaded lazily: with it)
    assert warm_modules({"transformers"}, local) == (*torch, "transformers", "transformers.trainer", worker)
    assert warm_modules({"torch", "lightning.pytorch"}, local) == (*torch, "lightning", worker)
    assert warm_modules({"accelerate.utils"}, local) == (*torch, "accelerate", worker)
    assert warm_modules({"numpy"}, local) == (worker,)  # no framework: the rank's own modules
    assert warm_modules({"numpy"}, spark) == ()  # on Spark: started the usual way
    assert warm_modules({"numpy", "jax"}, local) == ()
    assert warm_modules({"torch"}, spark) == (*torch, worker)  # by the executors' servers
    assert warm_modules({"horovod.torch"}, spark) == (*torch, worker)  # there or not: the server finds out
    # env= of any kind keeps a run warm (warm_modules does not take it): a rank takes its environment
    # after the fork, and a variable read at import gets a server of its own (the test below)


def test_a_runs_env_keeps_its_ranks_warm_and_what_is_read_at_import_gets_a_server_started_with_it(
    ip, tmp_path
):
    """A variable of the run's own reaches its forked ranks; one the frameworks may read at import
    (``TORCH*``, ``TF_*``, ``LD_*``, ...) is in the environment of the server they were forked
    from, another server than the runs' without it."""
    own = where(ip, tmp_path, "np=-2 env=OWN_HVD_TEST=1")
    (plain,) = {rank["grandparent"] for rank in own}
    assert "TORCH_HVD_TEST" not in psutil.Process(plain).environ()
    at_import = where(ip, tmp_path, "np=-2 env=TORCH_HVD_TEST=2")
    for seen, expected in [(own, {"OWN_HVD_TEST": "1"}), (at_import, {"TORCH_HVD_TEST": "2"})]:
        assert all(SERVER in " ".join(rank["parent"]) for rank in seen)  # forked: warm
        assert all(rank["optimizer_imports"] == 0 and rank["env"] == expected for rank in seen)
    (reading,) = {rank["grandparent"] for rank in at_import}
    assert reading != plain
    assert psutil.Process(reading).environ().get("TORCH_HVD_TEST") == "2"  # there when it imported


# A Horovod-Keras cell: each rank fits, sums its rank with the others', and writes what it saw.
KERAS_WHERE = """
import collections, json, os, sys
import tensorflow as tf
import horovod.tensorflow.keras as hvd
hvd.init()
tf.matmul(tf.ones((64, 64)), tf.ones((64, 64)))  # TensorFlow's intra-op pool starts: as many as its budget
tasks = os.listdir("/proc/self/task")
threads = collections.Counter(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
fitted = model.fit(tf.ones((8, 4)), tf.ones((8, 1)), epochs=2, verbose=0,
                   callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
server = int(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])
seen = {"parent": open(f"/proc/{os.getppid()}/cmdline").read().replace("\\0", " "), "server": server,
        "sum": float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)),
        "losses": len(fitted.history["loss"]), "compute_threads": threads["tf_Compute"],
        "budget": os.environ.get("TF_NUM_INTRAOP_THREADS"), "torch": "torch" in sys.modules}
open(os.path.join(DIRECTORY, f"{hvd.rank()}.json"), "w").write(json.dumps(seen))
"""


def test_a_keras_cells_ranks_are_forked_warm_and_train_together(ip, tmp_path):
    """TensorFlow and Keras are imported once (4 to 6 CPU-s a rank here); Horovod's binding by
    each rank (0.04). One server, kept for the next cell, whichever launcher that cell takes."""
    servers_seen = set()
    for launcher in ("mpi", "gloo"):
        folder = tmp_path / launcher
        folder.mkdir()
        ip.user_ns["DIRECTORY"] = str(folder)
        ip.run_cell_magic("horovod", f"np=-2 launcher={launcher}", KERAS_WHERE)
        for rank in range(2):
            seen = json.loads((folder / f"{rank}.json").read_text())
            assert SERVER in seen["parent"]  # forked (by the server's waiter)
            assert seen["sum"] == 3.0 and seen["losses"] == 2  # Horovod's collectives, in a fit
            assert seen["compute_threads"] == int(seen["budget"]) == 1  # the budget, read after the fork
            assert not seen["torch"]  # only what the cell imports was preloaded
            servers_seen.add(seen["server"])
    (server,) = servers_seen  # the second cell's ranks came from the first's server
    assert server in [p.pid for p in servers() if "tensorflow" in p.cmdline()]
    assert len([p for p in servers() if "tensorflow" in p.cmdline()]) == 1
    assert leftover_processes() == []


@pytest.mark.parametrize("start, framework", [("", "horovod"), ("backend=torch", "torch.distributed")])
def test_a_live_sessions_ranks_are_forked_warm_too(ip, start, framework):
    """Its set-up cell imports Horovod's PyTorch binding (or torch.distributed): PyTorch is preloaded."""
    ip.run_line_magic("horovod", f"start np=-2 {start}")
    try:
        cell = "import os\nopen(f'/proc/{os.getppid()}/cmdline').read(), sorted(sys.modules)"
        seen = ip.run_cell_magic("horovod", "", "import sys\n" + cell)
    finally:
        ip.run_line_magic("horovod", "stop")
    parent, modules = seen  # rank 0's
    assert SERVER in parent.replace("\0", " ")
    assert framework in modules and "tensorflow" not in modules
    assert setup_imports(make_options(np=-2)) == {"torch", "horovod.torch"}


@pytest.mark.parametrize("launcher", [LocalMpiLauncher, LocalGlooLauncher, LocalTorchLauncher])
def test_a_launcher_still_starting_has_not_ended(launcher):
    """Its fork server may take seconds to start before the first rank does: a session's beat
    that polls it then must not read an end (it once ended a session as it started)."""
    assert launcher(2).poll() is None


def test_the_stand_in_reads_the_variable_an_exec_agent_sets():
    """The stand-in, which imports nothing of ours, spells the protocol's name itself."""
    assert stand_in.FORK_SERVER == ENV_FORK_SERVER


def test_what_a_cell_or_a_function_imports_is_captured():
    cell = "import os, torch.nn as nn\nfrom horovod import torch as hvd\ndef f():\n    import numpy\n"
    assert pack_cell(cell, {}).imports >= {"os", "torch.nn", "horovod", "horovod.torch", "numpy"}
    assert "json" in pack_cell("x = json.dumps(1)", {"json": json}).imports  # a notebook's module

    def train():
        import horovod.torch as hvd

        return hvd, os.getpid()

    assert {"horovod.torch", "os"} <= pack_function(train, {}).imports


def test_a_rank_ends_with_its_stand_in(ip, tmp_path):
    """The stand-in is the rank's place in its launcher's tree: SIGKILLed, its rank goes too,
    and the run says which rank was killed."""

    def kill_a_stand_in() -> None:
        for process in psutil.Process().children(recursive=True):
            try:  # a process of another test's run may be a zombie by now
                if any(part.endswith(STAND_IN) for part in process.cmdline()[1:3]):  # not mpirun's
                    process.send_signal(signal.SIGKILL)
                    return
            except psutil.Error:
                continue

    when_started(tmp_path, 2, kill_a_stand_in)
    with pytest.raises(RunError, match=r"killed by signal 9 \(SIGKILL\)"):
        ip.run_cell_magic("horovod", "np=-2", waiting_cell(tmp_path, wait="time.sleep(120)\n", horovod=True))
    assert gone_within(10) == []


def test_a_server_that_died_is_started_anew(ip, tmp_path):
    before = {seen["grandparent"] for seen in where(ip, tmp_path)}
    for server in servers():
        server.kill()
        server.wait(10)
    after = {seen["grandparent"] for seen in where(ip, tmp_path)}
    assert len(after) == 1 and after != before
    assert leftover_processes() == []


def test_a_variable_read_at_import_changed_in_the_notebook_gets_a_new_server(ip, tmp_path, monkeypatch):
    """The ranks of the next cell see PyTorch imported with the notebook's environment of now."""
    before = {seen["grandparent"] for seen in where(ip, tmp_path)}
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")
    after = {seen["grandparent"] for seen in where(ip, tmp_path)}
    assert len(after) == 1 and after != before
    again = {seen["grandparent"] for seen in where(ip, tmp_path)}
    assert again == after  # kept while nothing changes


def test_a_variable_only_the_other_framework_reads_keeps_the_server(ip, tmp_path, monkeypatch):
    """PyTorch reads no ``TF_*`` variable at import: a notebook that sets one for its Keras cells
    keeps its PyTorch cells' server."""
    before = {seen["grandparent"] for seen in where(ip, tmp_path)}
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert {seen["grandparent"] for seen in where(ip, tmp_path)} == before


def test_only_the_interpreters_own_python_variables_get_a_server_of_their_own():
    """Spark gives each executor's Python workers ``PYTHON_*`` variables of their own (a secret, a
    batch size) that no import reads; ``PYTHONHASHSEED`` is the interpreter's, fixed as it starts."""
    first = serving(("json",), {"PYTHON_WORKER_FACTORY_SECRET": "a", "PYTHON_UDF_BATCH_SIZE": "100"})
    assert serving(("json",), {"PYTHON_WORKER_FACTORY_SECRET": "b"}) == first
    assert serving(("json",), {"PYTHONHASHSEED": "7"}) not in (first, None)


# A Spark task's Python worker asking for the server its keeper (argv[1]) shares; prints its socket.
ASK_THE_KEEPERS_SERVER = (
    "import sys\nfrom hvd_magic.warm.servers import serving\n"
    "print(serving(('hvd_magic.rank.worker',), {}, keeper=int(sys.argv[1])))\n"
)


def ask_the_keepers_server(keeper: int, tmp: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", ASK_THE_KEEPERS_SERVER, str(keeper)],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, TMPDIR=str(tmp)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def short_tmp():
    """A temporary folder with a short path (a socket's path has at most 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="hvd-") as folder:
        yield Path(folder)


def test_a_server_shared_under_a_keeper_serves_each_of_its_processes_and_ends_with_it(short_tmp):
    """An executor's Python workers (here, two processes one after the other) share the server
    their keeper (the executor's Python daemon) keeps: it outlives the worker that started it,
    and ends, its folder with it, once the keeper does."""
    tmp_path = short_tmp
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        first = ask_the_keepers_server(keeper.pid, tmp_path)  # starts it, then ends
        (server,) = fork_servers_of(keeper.pid)
        assert ask_the_keepers_server(keeper.pid, tmp_path) == first and fork_servers_of(keeper.pid) == [
            server
        ]
        assert Path(first).parent.parent == tmp_path / f"hvd_magic-servers-{os.getuid()}"
        assert Path(first).is_socket() and (Path(first).parent.stat().st_mode & 0o777) == 0o700
    finally:
        keeper.kill()
        keeper.wait()
    assert psutil.wait_procs([server], timeout=30)[1] == []
    assert not Path(first).parent.exists()


# A kernel that starts a fork server of its own, says its socket, and waits to be killed.
KEEPS_A_SERVER = """
import time
from hvd_magic.warm import servers
print(servers.serving(("json",), {}), flush=True)
time.sleep(600)
"""


def test_a_killed_kernels_server_ends_and_removes_its_folder(short_tmp):
    """A kernel killed before it could close its fork server: the server, which its keeper's end
    ends, removes its folder (socket, log, its ranks' notes) itself."""
    env = os.environ | {"TMPDIR": str(short_tmp)}
    argv = [sys.executable, "-c", KEEPS_A_SERVER]
    kernel = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        folder = Path(kernel.stdout.readline().strip()).parent
        (server,) = fork_servers_of(kernel.pid)
        assert folder.parent == short_tmp and (folder / "socket").is_socket()
    finally:
        kernel.kill()
        kernel.wait()
    assert psutil.wait_procs([server], timeout=30)[1] == []
    assert not folder.exists()


# A module whose import leaves a line in the file MARK says: imported once, one line.
COUNTS_ITS_IMPORTS = "import os\nopen(os.environ['MARK'], 'a').write('imported\\n')\n"


def preloader_of(server: psutil.Process) -> psutil.Process:
    (parent,) = [p for p in [server.parent()] if "hvd_magic.warm.preloader" in " ".join(p.cmdline())]
    return parent


def end_all(kernels: list[subprocess.Popen[str]], folder: Path) -> None:
    """Ends the test's kernels, and the preloaders and servers whose sockets lie in ``folder``."""
    for kernel in kernels:
        kernel.kill()
        kernel.wait()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if str(folder) in " ".join(process.cmdline()):
                process.kill()
                process.wait(10)


def test_kernels_one_after_another_fork_their_servers_from_one_preloader_that_imported_once(short_tmp):
    """A second kernel (a restarted one, another notebook) gets a server without importing again:
    both servers are forked from one preloader, which is no kernel's child (a launcher stopping
    what it started spares it) and outlives the first; each server ends with its own kernel."""
    (short_tmp / "counted.py").write_text(COUNTS_ITS_IMPORTS)
    mark = short_tmp / "imports"
    env = os.environ | {"TMPDIR": str(short_tmp), "PYTHONPATH": str(short_tmp), "MARK": str(mark)}
    code = KEEPS_A_SERVER.replace('("json",)', '("counted",)')
    kernels, preloaders = [], []
    try:
        for _ in range(2):
            kernel = subprocess.Popen(
                [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
            )
            kernels.append(kernel)
            assert Path(kernel.stdout.readline().strip()).is_socket()
            (server,) = fork_servers_of(kernel.pid)
            preloaders.append(preloader_of(server))
            assert preloaders[-1].pid not in {
                p.pid for p in psutil.Process(kernel.pid).children(recursive=True)
            }
            if len(kernels) == 1:
                kernel.kill()  # the first kernel ends before the second starts
                kernel.wait()
                assert psutil.wait_procs([server], timeout=30)[1] == []
        assert preloaders[0] == preloaders[1] and preloaders[1].is_running()
        assert mark.read_text() == "imported\n"  # by the preloader, once
    finally:
        end_all(kernels, short_tmp)


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def cpuacct_group(process: psutil.Process) -> str:
    lines = Path(f"/proc/{process.pid}/cgroup").read_text().splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == "cpuacct")


def test_a_server_forked_from_a_preloader_is_accounted_with_its_kernel(short_tmp):
    """A kernel in a cgroup of its own (a container's, a systemd unit's) gets a server there too,
    as one it started itself would be, not in the cgroup of whoever started the preloader."""
    group = CPUACCT / f"hvd_magic-test-{os.getpid()}-{short_tmp.name}"
    try:
        group.mkdir()
    except OSError:
        pytest.skip("needs a cgroup v1 cpuacct hierarchy to make a group in")
    env = os.environ | {"TMPDIR": str(short_tmp)}
    argv = [sys.executable, "-c", KEEPS_A_SERVER]
    kernels = []
    try:
        for moved in (False, True):  # the first starts the preloader outside the group
            join = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if moved else None
            kernels.append(
                subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=join)
            )
            assert Path(kernels[-1].stdout.readline().strip()).is_socket()
        (server,) = fork_servers_of(kernels[1].pid)
        assert cpuacct_group(server) == f"/{group.name}" != cpuacct_group(preloader_of(server))
    finally:
        end_all(kernels, short_tmp)
        with contextlib.suppress(OSError):
            group.rmdir()


def test_a_kernel_whose_path_finds_another_copy_of_the_framework_gets_a_preloader_of_its_own(short_tmp):
    """Two kernels whose paths find two copies of what the servers import (a package installed
    twice, the same file times) do not share a preloader: each imports its own."""
    mark = short_tmp / "imports"
    code = KEEPS_A_SERVER.replace('("json",)', '("counted",)')
    kernels, preloaders = [], []
    try:
        for copy in ("a", "b"):
            (short_tmp / copy).mkdir()
            (short_tmp / copy / "counted.py").write_text(COUNTS_ITS_IMPORTS)
            os.utime(short_tmp / copy / "counted.py", (1_000_000_000, 1_000_000_000))
            env = os.environ | {
                "TMPDIR": str(short_tmp),
                "PYTHONPATH": str(short_tmp / copy),
                "MARK": str(mark),
            }
            kernel = subprocess.Popen(
                [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
            )
            kernels.append(kernel)
            assert Path(kernel.stdout.readline().strip()).is_socket()
            (server,) = fork_servers_of(kernel.pid)
            preloaders.append(preloader_of(server))
        assert preloaders[0] != preloaders[1] and mark.read_text() == "imported\n" * 2
    finally:
        for kernel in kernels:
            kernel.kill()
            kernel.wait()
        for preloader in preloaders:
            preloader.kill()


@pytest.mark.parametrize("end", ["idle", "folder removed"])
def test_a_preloader_ends_when_idle_or_when_its_folder_is_gone(short_tmp, end):
    """A preloader outlives its starter: it ends by itself, its folder with it, once no server was
    asked of it for its idle time, or once its folder was removed (a TMPDIR that went)."""
    folder = short_tmp / "preloader"
    folder.mkdir(mode=0o700)
    idle = "1" if end == "idle" else "600"
    argv = [sys.executable, "-m", "hvd_magic.warm.preloader", idle, str(folder / "socket"), "json"]
    starter = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=120, cwd=folder)
    assert starter.stdout == "ready\n"  # said by the preloader, which forked away from the starter
    preloader = psutil.Process(int((folder / "pid").read_text()))
    assert preloader.ppid() != os.getpid()
    if end == "folder removed":
        shutil.rmtree(folder)
    assert psutil.wait_procs([preloader], timeout=60)[1] == []
    assert not folder.exists()


def test_a_preloader_refuses_a_request_that_names_no_server_and_goes_on(short_tmp):
    folder = short_tmp / "preloader"
    folder.mkdir(mode=0o700)
    argv = [sys.executable, "-m", "hvd_magic.warm.preloader", "600", str(folder / "socket"), "json"]
    log = folder / "log"
    with log.open("w") as stderr:
        subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, timeout=120, cwd=folder, check=True)
    preloader = psutil.Process(int((folder / "pid").read_text()))
    try:
        for request in (
            {"socket": "relative/socket", "keeper": 1},
            {"socket": str(short_tmp / "s"), "keeper": "1"},
        ):
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.settimeout(30)
                conn.connect(str(folder / "socket"))
                conn.sendall(json.dumps(request).encode())
                assert conn.recv(4096) == b""  # closed, unanswered: nothing forked
        said = log.read_text()
        assert "refused a request: no folder for a server's socket at 'relative/socket'" in said
        assert "refused a request: not a keeper's pid: '1'" in said
        assert preloader.is_running() and preloader.children() == []
    finally:
        preloader.kill()


# Workers that wait for a line on stdin, then ask at the same moment for their keepers' servers.
ASK_WHEN_TOLD = ASK_THE_KEEPERS_SERVER.replace("\nprint(", "\nsys.stdin.readline()\nprint(")
ENDED_KEEPER = 4_194_305  # above any pid (Linux's pid_max is at most 2**22)


def test_workers_of_several_executors_start_their_servers_at_once_beside_what_ended_keepers_left(short_tmp):
    """The Python workers of three executors on one machine start their servers at the same moment,
    each sweeping away what keepers that ended left: every one is served (seen in CI: a task
    failed when another had removed a leftover between its listing and its removal)."""
    base = short_tmp / f"hvd_magic-servers-{os.getuid()}"
    base.mkdir(mode=0o700)
    for n in range(2000):
        (base / f"{ENDED_KEEPER}-{n:020d}.lock").touch()
        (base / f"{ENDED_KEEPER}-{n:020d}").mkdir()
    keepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(3)]
    env = dict(os.environ, TMPDIR=str(short_tmp))
    try:
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", ASK_WHEN_TOLD, str(keeper.pid)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for keeper in keepers
        ]
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        said = [worker.communicate(timeout=180) for worker in workers]
        assert [worker.returncode for worker in workers] == [0, 0, 0], said
        sockets = [Path(out.strip()) for out, _ in said]
        assert all(path.is_socket() and path.parent.parent == base for path in sockets), said
        assert len(set(sockets)) == 3
        assert not [entry for entry in os.listdir(base) if entry.startswith(f"{ENDED_KEEPER}-")]
    finally:
        for keeper in keepers:
            keeper.kill()
            keeper.wait()


def test_a_shared_servers_folder_that_others_may_enter_is_not_used(short_tmp):
    """Where this user's folder of shared servers lets others in, the worker keeps a server of
    its own instead (which ends with it), in a folder only it may enter."""
    tmp_path = short_tmp
    (tmp_path / f"hvd_magic-servers-{os.getuid()}").mkdir(mode=0o755)
    os.chmod(tmp_path / f"hvd_magic-servers-{os.getuid()}", 0o755)
    own = ask_the_keepers_server(os.getpid(), tmp_path)
    assert Path(own).parent.name.startswith("hvd_magic-fork-")
    assert os.listdir(tmp_path / f"hvd_magic-servers-{os.getuid()}") == []  # no server nor preloader there


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK), reason="runs a peer as another user"
)
@pytest.mark.parametrize("asked", ["server", "preloader"])
def test_the_server_and_its_preloader_answer_only_their_own_user(ip, tmp_path, asked):
    (used,) = {seen["grandparent"] for seen in where(ip, tmp_path)}  # a server is up
    process = psutil.Process(used) if asked == "server" else preloader_of(psutil.Process(used))
    socket_path = next(part for part in process.cmdline() if part.endswith("/socket"))
    folder = os.path.dirname(socket_path)
    opened = [folder, os.path.dirname(folder)] if asked == "preloader" else [folder]  # and its base
    for path in opened:
        os.chmod(path, 0o755)  # as if the folder let others in: the peer check still holds
    os.chmod(socket_path, 0o777)
    try:
        peer = (  # a stand-in's request; what comes back (b'' once the server closed on it)
            "import array, json, socket, sys\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect(sys.argv[1])\n"
            "try:\n"
            "    s.sendmsg([json.dumps({'env': {}, 'cwd': '/'}).encode()],\n"
            "              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [0, 1, 2]))])\n"
            "    answer = s.recv(4096)\n"
            "except (BrokenPipeError, ConnectionResetError):\n"
            "    answer = b''\n"
            "print(len(answer))\n"
        )
        done = subprocess.run(
            ["/usr/bin/python3", "-c", peer, socket_path],  # the suite's venv is under /root
            user=65534,
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
    finally:
        for path in opened:
            os.chmod(path, 0o700)
    assert done.stdout.strip() == "0", done.stderr  # closed, unanswered: nothing forked
    log = Path(folder, "log").read_text()
    assert "refused a request: peer of user 65534" in log


# NVIDIA's driver as a fork server sees it: its file name and the one call asked of it, answering
# as the driver does before cuInit (3, CUDA_ERROR_NOT_INITIALIZED) and after (0).
DRIVER = "int cuCtxGetCurrent(void **context) {{ *context = 0; return {code}; }}\n"


def server_started(tmp_path: Path, modules: list[str], env: dict[str, str]) -> tuple[bool, str]:
    """Whether a fork server preloading ``modules`` said it was ready, and what it wrote to stderr."""
    server = subprocess.Popen(
        [sys.executable, "-m", SERVER, str(tmp_path / "socket"), *modules], env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    said = server.stdout.readline()  # "ready", or nothing as it ends
    server.stdin.close()  # held open, it serves till closed
    server.wait(60)
    return said == "ready\n", server.stderr.read()


@pytest.mark.parametrize(("code", "forks"), [(3, True), (0, False)])
def test_a_server_whose_imports_set_up_cuda_does_not_fork(tmp_path, code, forks):
    """Whatever framework set up the driver in the server (a fork's child could not use it), the
    server refuses to serve, and the ranks start the usual way; a driver only loaded is fine."""
    (tmp_path / "driver.c").write_text(DRIVER.format(code=code))
    library = tmp_path / "libcuda.so.1"
    compile_driver = ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library)]
    subprocess.run([*compile_driver, str(tmp_path / "driver.c")], check=True)
    loads = f"import ctypes\nctypes.CDLL({str(library)!r}, mode=ctypes.RTLD_GLOBAL)\n"
    (tmp_path / "framework.py").write_text(loads)
    served, said = server_started(tmp_path, ["framework"], os.environ | {"PYTHONPATH": str(tmp_path)})
    assert served is forks
    assert ("started CUDA; not forking" in said) is not forks


@pytest.mark.parametrize(
    ("modules", "serves"),
    [
        (["json", "json.no_such_module"], True),  # a framework's module it lacks (an older torch's)
        (["json", "no_such_framework"], False),  # a framework missing: its ranks start the usual way
    ],
)
def test_a_module_of_a_framework_is_preloaded_where_the_framework_has_it(tmp_path, modules, serves):
    assert server_started(tmp_path, modules, dict(os.environ))[0] is serves
