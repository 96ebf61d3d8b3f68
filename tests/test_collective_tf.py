"""Horovod's TensorFlow gradient allreduce, timed for the straggler watch, leaves the user's
training as it was: the same gradients, Horovod's collectives under the same names (ranks match
them by name), one trace of the step, nothing in a TF1 graph's variables. Real TensorFlow and a
single-process Horovod in a fresh interpreter (the timing is installed at import)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .helpers import single_process_env

SETUP = """import json, os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
from hvd_magic.rank import collective_tf
from hvd_magic.rank import collective_time
"""

TF2 = """import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)])
x = tf.ones((4, 8))

def step_function():
    traces = []
    @tf.function
    def step(x):
        traces.append(1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    return step, traces

def ops(step, kind="Horovod"):
    found = []
    def walk(graph):
        found.extend(op.name for op in graph.get_operations() if op.type.startswith(kind))
        for function in graph._functions.values():
            walk(function.graph)
    walk(step.get_concrete_function(x).graph)
    return sorted(found)

plain, _ = step_function()
untimed, plain_grads = ops(plain), plain(x)
before = collective_time.waited()
collective_tf.time_tensorflow()  # horovod.tensorflow is imported: in place at once
timed, traces = step_function()
timed_grads = [timed(x) for _ in range(3)][-1]
in_graph = collective_time.waited()
doubled = collective_tf.timed(lambda gradients, *args, **kwargs: [g * 2.0 for g in gradients])
compiled = tf.function(jit_compile=True)(lambda x: doubled([x])[0])  # XLA: no timestamp, not timed
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(x))
hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)  # eagerly: the call is timed
print(json.dumps({
    "untimed": untimed, "timed": ops(timed), "traces": len(traces), "before": before,
    "probe": float(probe.numpy()) if (probe := collective_tf._variables.get("hvd_magic_probe")) else None,
    "expected": sum(float(tf.reshape(g, [-1])[0]) for g in timed_grads),  # an element of each
    "xla": float(compiled(tf.ones(()))),
    "same": all(bool(tf.reduce_all(a == b)) for a, b in zip(plain_grads, timed_grads, strict=True)),
    "in_graph": in_graph, "eager": collective_time.waited() - in_graph,
}))
"""

TF1 = """collective_tf.time_tensorflow()
import horovod.tensorflow as hvd
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
hvd.init()
w = tf.compat.v1.get_variable("w", initializer=tf.ones((3,)))
train = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(tf.reduce_sum(w))
with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(train)
    print(json.dumps({"variables": [v.name for v in tf.compat.v1.global_variables()],
                      "waited": collective_time.waited()}))
"""


def run(script: str, setup: str = SETUP) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", setup + script],
        capture_output=True,
        text=True,
        timeout=300,
        env=single_process_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_timed_gradients_are_the_same_under_the_same_names_in_one_trace(device):
    """On "gpu", the way a TensorFlow that sees a GPU times the step (its first stamp after a
    probe of the gradients copied to the host), run on the CPU: there is no GPU here."""
    found = run(TF2, SETUP + ("collective_tf._cpu_only = False\n" if device == "gpu" else ""))
    if device == "gpu":  # the probe ran (a store Grappler keeps), after the gradients it reads
        assert found["probe"] == pytest.approx(found["expected"]) and found["expected"] != 0
    else:
        assert found["probe"] is None
    assert found["xla"] == 2.0  # a step XLA compiles is left as it is
    assert found["before"] is None  # nothing timed yet
    assert found["untimed"] and found["timed"] == found["untimed"]  # Horovod gets the same tensors
    assert found["same"] and found["traces"] == 1  # the user's step is traced once, as without
    assert isinstance(found["in_graph"], float) and found["in_graph"] >= 0  # measured in the graph
    assert found["eager"] > 0  # and around an eager call


def test_a_tf1_graph_is_left_alone():
    found = run(TF1)
    assert found == {"variables": ["w:0"], "waited": None}
