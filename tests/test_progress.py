"""One-line reporting from real training loops on real ranks: Keras callback and torch helper."""

from __future__ import annotations

import pytest

from hvd_magic.options import make_options
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks
from hvd_magic.widgets.state import RunModel

from .helpers import RecordingView


def run(cell: str) -> RunModel:
    view = RecordingView()
    run_on_ranks(pack_cell(cell, {}), make_options(np=-2), view)
    model = RunModel(2)
    for message in view.messages:
        model.apply(message)
    return model


def test_keras_live_callback_reports_every_batch():
    model = run(
        "import numpy as np, tensorflow as tf, hvd_magic, horovod.tensorflow.keras as hvd\n"
        "hvd.init()\n"
        "net = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])\n"
        "net.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss='mse')\n"
        "x, y = np.random.rand(40, 4), np.random.rand(40, 1)\n"
        "net.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_split=0.2,\n"
        "        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd_magic.LiveCallback()]);\n"
    )
    for progress in model.progress:
        assert (progress.step, progress.total, progress.epoch, progress.fraction) == (8, 8, 1, 1.0)
    assert len(model.series["loss"][0].values) == 8
    assert model.series["val_loss"][1].steps == [4.0, 8.0]  # validation lands on the epoch's last step


@pytest.mark.parametrize("sized", [True, False])
def test_torch_progress_helper(sized):
    source = "range(5)" if sized else "iter(range(5))"
    total = "" if sized else ", total=5"
    model = run(
        "import hvd_magic, horovod.torch as hvd\nhvd.init()\n"
        "for epoch in range(3):\n"
        f"    for batch in hvd_magic.progress({source}, epoch=epoch, epochs=3{total}):\n"
        "        hvd_magic.report(loss=1.0 / (batch + 1))\n"
    )
    for progress in model.progress:
        assert (progress.step, progress.total, progress.epoch, progress.fraction) == (15, 15, 2, 1.0)
    assert model.series["loss"][0].steps == [float(s) for s in range(1, 16)]
