"""``logdir=``: TensorBoard event files written on the notebook's side from what real ranks
report, read back with TensorBoard's own event reader."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from hvd_magic import HorovodRunner, RankFailedError
from hvd_magic.sinks import model_dir_logdir
from hvd_magic.sinks import tensorboard as tensorboard_sink

from .helpers import wait_for_files

# Each rank reports its own random losses for steps 1-5 and returns them (the ground truth);
# rank 0 alone reports an accuracy (at its current step, 5).
REPORTING_CELL = """
import random, horovod.torch as hvd, hvd_magic
hvd.init()
rng = random.Random(hvd.rank())
sent = []
for step in range(1, 6):
    loss = rng.random()
    hvd_magic.report(step=step, total=5, loss=loss)
    sent.append((step, loss))
if hvd.rank() == 0:
    hvd_magic.report(accuracy=0.75)
hvd.allgather_object(sent)
"""


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in a run's folder, as TensorBoard reads it (all points kept)."""
    from tensorboard.backend.event_processing import event_accumulator

    reader = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {
        tag: [(event.step, event.value) for event in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]
    }


def same_points(written: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """The same steps, and the same values to float32's precision (TensorBoard keeps float32)."""
    return [step for step, _ in written] == [step for step, _ in expected] and [
        value for _, value in written
    ] == pytest.approx([value for _, value in expected], rel=1e-6)


def without_tensorboard(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if tensorboard were not installed: its modules cannot be imported."""
    for name in [name for name in sys.modules if name.startswith("tensorboard.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "tensorboard", None)


def only_run(logdir: Path) -> Path:
    runs = list(logdir.iterdir())
    assert len(runs) == 1, runs
    assert re.fullmatch(r"\d{8}-\d{6}\.\d{3}-[0-9a-f]{6}", runs[0].name), runs[0].name
    return runs[0]


def test_logdir_has_each_ranks_metrics_and_their_mean_at_each_step(ip, tmp_path):
    logdir = tmp_path / "logs"
    sent = ip.run_cell_magic("horovod", f"np=-2 logdir={logdir}", REPORTING_CELL)
    written = read_scalars(only_run(logdir))
    for rank in (0, 1):
        assert same_points(written[f"loss/rank_{rank}"], sent[rank])
    means = [(step, (sent[0][i][1] + sent[1][i][1]) / 2) for i, step in enumerate(range(1, 6))]
    assert same_points(written["loss"], means)
    assert written["accuracy/rank_0"] == [(5, 0.75)]
    assert written["accuracy"] == [(5, 0.75)]  # the mean over the ranks that reported it
    reported = sorted(tag for tag in written if not tag.startswith("resources/"))
    assert reported == ["accuracy", "accuracy/rank_0", "loss", "loss/rank_0", "loss/rank_1"]
    for rank in (0, 1):  # each rank's resources, as it sampled them (its first sample at least)
        assert written[f"resources/memory_mb/rank_{rank}"] and written[f"resources/cpu_percent/rank_{rank}"]
        assert all(10 < mb < 100_000 for _, mb in written[f"resources/memory_mb/rank_{rank}"])
    assert not [tag for tag in written if tag.startswith("resources/gpu")]  # no GPU here


def test_each_ranks_resources_are_written_at_the_seconds_since_the_run_began(tmp_path):
    """Fed as a run feeds the sink: RankStatus messages at known times (rank 1 with a GPU)."""
    from hvd_magic.protocol import Message, RankStatus

    now = [100.0]
    sink = tensorboard_sink.TensorBoardSink(str(tmp_path / "run"), ranks=2, clock=lambda: now[0])
    samples = [
        (100.4, 0, RankStatus(rss=300 * 2**20, cpu=50.0)),
        (101.6, 1, RankStatus(rss=2**30, cpu=90.0, gpu=75.0, gpu_memory=2**32, gpu_temperature=61.0)),
        (102.2, 0, RankStatus(rss=310 * 2**20, cpu=100.0)),
    ]
    for at, rank, status in samples:
        now[0] = at
        sink.message(Message(status, rank))
    sink.close(None)
    assert read_scalars(tmp_path / "run") == {
        "resources/cpu_percent/rank_0": [(0, 50.0), (2, 100.0)],
        "resources/memory_mb/rank_0": [(0, 300.0), (2, 310.0)],
        "resources/cpu_percent/rank_1": [(1, 90.0)],
        "resources/memory_mb/rank_1": [(1, 1024.0)],
        "resources/gpu_percent/rank_1": [(1, 75.0)],
        "resources/gpu_memory_mb/rank_1": [(1, 4096.0)],
        "resources/gpu_temperature_c/rank_1": [(1, 61.0)],
    }


def test_each_run_has_a_folder_of_its_own_and_a_failed_run_keeps_what_came_before(ip, tmp_path):
    logdir = tmp_path / "logs"
    cell = """
import horovod.torch as hvd, hvd_magic
hvd.init()
for step in range(1, 4):
    hvd_magic.report(step=step, loss=10.0 * step + hvd.rank())
hvd_magic.rank.reporting.current().flush()  # sent now, not on the next tick: before rank 1's error
hvd.allreduce(__import__("torch").zeros(1))
if hvd.rank() == 1:
    raise ValueError("boom")
"""
    ip.run_cell_magic(
        "horovod", f"np=-2 logdir={logdir}", "import hvd_magic\nhvd_magic.report(step=1, x=1.0)"
    )
    first = only_run(logdir)
    with pytest.raises(RankFailedError, match="boom"):
        ip.run_cell_magic("horovod", f"np=-2 logdir={logdir}", cell)
    (failed,) = set(logdir.iterdir()) - {first}
    written = read_scalars(failed)
    assert written["loss/rank_1"] == [(1, 11.0), (2, 21.0), (3, 31.0)]
    assert written["loss"] == [(1, 10.5), (2, 20.5), (3, 30.5)]
    assert read_scalars(first)["x"] == [(1, 1.0)]


def test_tensorboard_sees_the_points_while_the_run_is_going(ip, tmp_path):
    """The files are flushed every few seconds: a TensorBoard watching the folder sees a run's
    points before it ends. Here the ranks wait (bounded) for a gate that only a reader of the
    event files opens."""
    logdir, gate = tmp_path / "logs", tmp_path / "gate"
    cell = f"""
import os, time, horovod.torch as hvd, hvd_magic
hvd.init()
hvd_magic.report(step=1, loss=float(hvd.rank()))
deadline = time.monotonic() + 60
while not os.path.exists({str(gate)!r}):
    assert time.monotonic() < deadline, "the event files did not show the points during the run"
    time.sleep(0.05)
"""

    def open_gate_once_written() -> None:
        deadline = threading.Event()
        while not deadline.wait(0.2):
            runs = list(logdir.iterdir()) if logdir.exists() else []
            if runs and read_scalars(runs[0]).get("loss") == [(1, 0.5)]:
                gate.write_text("go")
                return

    reader = threading.Thread(target=open_gate_once_written, daemon=True)
    reader.start()
    ip.run_cell_magic("horovod", f"np=-2 logdir={logdir}", cell)
    assert wait_for_files([gate], timeout=0)
    assert tensorboard_sink.FLUSH_SECONDS < 60


def test_horovod_runner_takes_logdir(tmp_path):
    def main():
        import hvd_magic

        hvd_magic.report(step=3, loss=2.5)

    HorovodRunner(np=-2, logdir=str(tmp_path / "runner")).run(main)
    written = read_scalars(only_run(tmp_path / "runner"))
    assert written["loss"] == [(3, 2.5)]
    assert written["loss/rank_0"] == written["loss/rank_1"] == [(3, 2.5)]


def test_logdir_without_tensorboard_says_what_to_install(ip, monkeypatch, tmp_path):
    without_tensorboard(monkeypatch)
    with pytest.raises(UsageError, match=re.escape("pip install hvd_magic[tensorboard]")):
        ip.run_cell_magic("horovod", f"np=-2 logdir={tmp_path}", "1")
    with pytest.raises(ValueError, match=re.escape("pip install hvd_magic[tensorboard]")):
        HorovodRunner(np=-2, logdir=str(tmp_path))


def test_an_estimators_model_dir_has_its_event_files_when_tensorboard_is_installed(monkeypatch, tmp_path):
    assert model_dir_logdir(str(tmp_path)) == str(tmp_path / "logs")
    assert model_dir_logdir(None) is None
    without_tensorboard(monkeypatch)
    assert model_dir_logdir(str(tmp_path)) is None  # a default, not a request: no error


def test_keras_own_tensorboard_callback_writes_in_a_rank(ip, tmp_path):
    """With tensorboard installed (hvd_magic[tensorboard]), Keras' TensorBoard callback works in
    the ranks; without it, TensorFlow 2.21 raises TBNotInstalledError."""
    cell = f"""
import os, numpy as np, tensorflow as tf
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
model.compile("sgd", "mse")
model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=2, verbose=0,
          callbacks=[tf.keras.callbacks.TensorBoard({str(tmp_path)!r})])
"""
    ip.run_cell_magic("horovod", "np=-1", cell)
    from tensorboard.backend.event_processing import event_accumulator

    reader = event_accumulator.EventAccumulator(str(tmp_path / "train"))
    reader.Reload()
    assert "epoch_loss" in reader.Tags()["tensors"]


def test_logdir_and_mlflow_are_refused_for_a_live_session(ip, tmp_path):
    for option in (f"logdir={tmp_path}", "mlflow=yes"):
        with pytest.raises(
            UsageError, match=f"{option.split('=')[0]}= is for a job of its own or a session's cell"
        ):
            ip.run_line_magic("horovod", f"start np=-2 {option}")
