"""%%horovod np=-N end to end: a real IPython shell, real mpirun / Gloo, real Horovod ranks."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from jupyter_client.manager import start_new_kernel

from hvd_magic import CaptureError, RankFailedError

from .helpers import leftover_processes
from .kernels import Kernel

ALLREDUCE_CELL = """
import horovod.torch as hvd, torch
hvd.init()
hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
"""


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_last_expression_of_rank0_is_the_cell_output(ip, launcher):
    result = ip.run_cell(f"%%horovod np=-2 launcher={launcher}\n{ALLREDUCE_CELL}", store_history=True)
    assert result.error_in_exec is None, result.error_in_exec
    assert result.result == 3.0
    assert ip.user_ns["_"] == 3.0
    assert ip.user_ns["Out"][result.execution_count] == 3.0


def test_notebook_names_travel_and_return_names_come_back(ip):
    ip.run_cell("import torch\nlr = 0.25\ndef make_model():\n    return torch.nn.Linear(2, 1)\n")
    ip.run_cell("class Scale:\n    def __init__(self, k):\n        self.k = k\n")
    cell = """
import horovod.torch as hvd
hvd.init()
model = make_model()
steps = int(Scale(4).k * lr * 8)
size = hvd.size()
rank_seen = hvd.rank()
"""
    ip.run_cell_magic("horovod", "np=-2 return=steps,size,rank_seen,model", cell)
    assert ip.user_ns["steps"] == 8
    assert ip.user_ns["size"] == 2
    assert ip.user_ns["rank_seen"] == 0
    assert ip.user_ns["model"].weight.shape == (1, 2)


class _Watcher(io.StringIO):
    """Stands in for sys.stdout; opens the gate for the ranks once both said they are running."""

    def __init__(self, gate: Path) -> None:
        super().__init__()
        self.gate = gate

    def write(self, text: str) -> int:
        n = super().write(text)
        value = self.getvalue()
        if "[0] running" in value and "[1] running" in value and not self.gate.exists():
            self.gate.write_text("go")
        return n


def test_rank_output_streams_while_the_run_is_going(ip, tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    watcher = _Watcher(gate)
    monkeypatch.setattr(sys, "stdout", watcher)
    # Each rank prints, then waits (bounded) for the gate that only the streamed output opens.
    cell = f"""
import os, time, horovod.torch as hvd
hvd.init()
print("running", hvd.rank())
deadline = time.monotonic() + 60
while not os.path.exists({str(gate)!r}):
    assert time.monotonic() < deadline, "output did not reach the notebook while the run was going"
    time.sleep(0.05)
print("finished", hvd.rank())
"""
    ip.run_cell_magic("horovod", "np=-2", cell)
    out = watcher.getvalue()
    assert "[0] finished 0" in out and "[1] finished 1" in out
    assert out.index("[1] running 1") < out.index("[1] finished 1")


def test_failing_rank_is_named_with_traceback_and_nothing_is_left(ip):
    cell = """
import horovod.torch as hvd, torch
hvd.init()
if hvd.rank() == 1:
    1 / 0
hvd.allreduce(torch.tensor([1.0]))   # rank 0 blocks here until it is stopped
"""
    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        ip.run_cell_magic("horovod", "np=-2", cell)
    assert time.monotonic() - started < 60  # not a hang: the other rank was stopped
    err = info.value
    assert err.rank == 1
    assert err.exc_type == "ZeroDivisionError"
    assert "1 / 0" in err.remote_traceback and "<horovod cell>" in err.remote_traceback
    assert "rank 1" in str(err) and "the other rank was stopped" in str(err)
    assert leftover_processes() == []
    # The next run works.
    assert ip.run_cell_magic("horovod", "np=-2", ALLREDUCE_CELL) == 3.0


SILENT_DEATH_CELL = """
import os, signal, horovod.torch as hvd, torch
hvd.init()
if hvd.rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)   # as the OOM killer would: not a word
for _ in range(100):
    hvd.allreduce(torch.tensor([1.0]))
"""


@pytest.mark.parametrize("launcher", ["mpi", "gloo"])
def test_a_rank_killed_without_a_word_is_named_not_the_rank_it_took_down(ip, launcher):
    """Rank 0 then fails too ("Horovod has been shut down"), or mpirun stops it: either way
    the error must name rank 1 and how it ended."""
    from hvd_magic import RunError

    with pytest.raises(RunError) as info:
        ip.run_cell_magic("horovod", f"np=-2 launcher={launcher}", SILENT_DEATH_CELL)
    message = str(info.value)
    assert "rank 1 was killed by signal 9 (SIGKILL)" in message or (
        isinstance(info.value, RankFailedError)
        and info.value.rank == 1
        and "killed by signal 9 (SIGKILL)" in message
    ), message
    assert "rank 0 on" not in message.split(";")[0]
    assert leftover_processes() == []


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("", "np= is required"),
        ("np=0", "np must not be 0"),
        ("np=two", "np must be a whole number"),
        ("np=-2 launcher=ssh", "invalid choice"),
        ("np=-2 frobnicate=1", "unknown option 'frobnicate'"),
        ("np=-2 env=NOEQUALS", "env takes KEY=VALUE"),
        ("np=-2 return=a,1b", "not names"),
        ("np=-2 timeout=-3", "timeout must be positive"),
        ("np=-2 'unclosed", "not well quoted (No closing quotation)"),
        ("np=2 np=3", "option 'np' is given twice"),
        ("-np 2 np=3", "option 'np' is given twice"),
        ("np=-2 timeout=5 --timeout 6", "option 'timeout' is given twice"),
        ("np=-2 retries=1 checkpoint_dir=nosuch://bucket/x", "no file system is known for 'nosuch://'"),
        # (s3fs is not in the suite's environment)
        ("np=-2 retries=1 checkpoint_dir=s3://b", "file system is not installed: pip install s3fs"),
    ],
)
def test_bad_options_raise_usage_error_with_usage(ip, line, fragment, capsys):
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("horovod", line, "1")
    assert fragment in str(info.value)
    if "quoted" not in fragment:
        assert "usage: %%horovod np=N" in str(info.value)
    # As a notebook shows it: the message, no traceback.
    ip.run_cell(f"%%horovod {line}\n1")
    shown = capsys.readouterr()
    assert fragment in shown.out + shown.err and "Traceback" not in shown.out + shown.err


def test_option_spellings(ip):
    for line in ("-np -2", "--np -2", "--np=-2", "np=-2"):
        assert ip.run_cell_magic("horovod", line, "import os\n40 + 2") == 42


def test_help_is_generated_from_the_options(ip):
    doc = ip.find_cell_magic("horovod").__doc__
    assert "--np" in doc and "--launcher" in doc and "--return" in doc


def test_unpicklable_name_is_reported_by_name_before_launch(ip):
    ip.run_cell("import threading\nlock = threading.Lock()")
    with pytest.raises(CaptureError) as info:
        ip.run_cell_magic("horovod", "np=-2", "with lock:\n    pass\n")
    message = str(info.value)
    assert "lock (_thread.lock)" in message and "inside the cell" in message
    assert ip.user_ns["lock"] is not None  # the notebook's state is untouched


def test_syntax_error_is_reported_before_launch(ip):
    with pytest.raises(CaptureError, match="syntax error on line 2"):
        ip.run_cell_magic("horovod", "np=-2", "x = 1\nx +* 2\n")
    with pytest.raises(CaptureError, match="cannot be compiled: source code string cannot contain null"):
        ip.run_cell_magic("horovod", "np=-2", "x = '\0'\n")  # pasted from a binary file, say


def test_trailing_semicolon_suppresses_the_value(ip):
    assert ip.run_cell_magic("horovod", "np=-2", "41 + 1;") is None


def test_tensorflow_keras_ranks(ip, capsys):
    cell = """
import sys
import tensorflow as tf
print("the rank's own stderr line", file=sys.stderr)
import horovod.tensorflow.keras as hvd
hvd.init()
model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), loss="mse")
model.fit(tf.ones((8, 2)), tf.ones((8, 1)), epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum))
"""
    assert ip.run_cell_magic("horovod", "np=-2", cell) == 3.0
    shown = capsys.readouterr().err  # TensorFlow's start-up INFO lines stay out of the cell, as in a notebook
    assert "the rank's own stderr line" in shown
    assert "oneDNN" not in shown and "absl::InitializeLog" not in shown


def test_gloo_ranks_can_shut_down_and_init_again(ip):
    """A second rendezvous in one run goes through the same loopback store."""
    cell = (
        "import horovod.torch as hvd, torch\nhvd.init()\n"
        "a = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()\nhvd.shutdown()\nhvd.init()\n"
        "(a, hvd.allreduce(torch.tensor([2.0]), op=hvd.Sum).item())"
    )
    assert ip.run_cell_magic("horovod", "np=-2 launcher=gloo timeout=120", cell) == (2.0, 4.0)


def test_a_local_np_far_above_the_cores_is_refused_before_anything_starts(ip, capsys, monkeypatch):
    monkeypatch.setattr("hvd_magic.options.local_ranks.machine_cores", lambda: 2)
    before = leftover_processes(settle=0)
    with pytest.raises(UsageError, match=r"1,000 ranks on this machine, which has 2 CPU cores") as info:
        ip.run_cell_magic("horovod", "np=-1000", "1")
    assert "oversubscribe=yes" in str(info.value) and "np=1000 to run on the Spark cluster" in str(info.value)
    assert leftover_processes(settle=0) == before  # nothing was launched


def test_a_local_np_above_the_cores_runs_and_says_so_once(ip, capsys, monkeypatch):
    monkeypatch.setattr("hvd_magic.options.local_ranks.machine_cores", lambda: 1)
    assert ip.run_cell_magic("horovod", "np=-2", "import os\n7") == 7
    shown = capsys.readouterr()
    assert (shown.out + shown.err).count("np=-2 runs 2 ranks on this machine's 1 CPU core") == 1
    # and oversubscribe=yes takes a count the check would refuse
    assert ip.run_cell_magic("horovod", "np=-5 oversubscribe=yes", "import os\n8") == 8


def test_in_a_kernel_load_ext_warms_the_live_views_imports_before_the_first_cell(tmp_path):
    """A first cell with the live view paid plotly's FigureWidget imports (nbformat, jsonschema:
    1.6 s of its 2.7 s here): ``%load_ext`` makes them on a thread while the notebook waits."""
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    kernel = Kernel(manager, client)
    try:
        assert kernel.run("%load_ext hvd_magic").status == "ok"
        names = ("hvd_magic.widgets.live_view", "plotly.graph_objs._figurewidget")
        warmed = kernel.run(
            "import sys, threading\n"
            "[t.join(120) for t in threading.enumerate() if t.name == 'hvd_magic-warm-view']\n"
            f"[name for name in {names!r} if name in sys.modules]"
        )
        assert warmed.value == repr(list(names)), warmed
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
