"""Horovod's TensorFlow gradient allreduce, timed (Horovod ranks; see ``collective_time``).

In lock-step Keras or ``DistributedGradientTape`` training a rank waits inside the graph, in
Horovod's allreduce op, for the others' gradients: Python never sees the wait. The function
Horovod makes to allreduce a step's gradients (``_make_allreduce_grads_fn``, behind
``DistributedOptimizer``, the Keras binding's optimizer and ``DistributedGradientTape``) is
wrapped: in a graph, two ``tf.timestamp`` ops, one once every gradient is computed and one once
every allreduced gradient is there, and the difference added to a variable (no Python in the
step); run eagerly, the call itself is timed. As DDP's last bucket, this times the wait after
the rank's own backward pass. Horovod gets the gradients it would get without this (its
collectives are named after them and matched across ranks by name).

On a GPU an op is "done" once queued, so a stamp after the gradients' ops would not mark their
end: there the first stamp waits for a probe, the sum of an element of each gradient stored in
a variable on the host, which the host has only once the device has computed them all (a slice
per gradient and one number copied a step; Horovod's op is done only once its result is there,
so the second stamp needs none). Run eagerly on a GPU, the same ops run one by one: the probe's
copy waits for the gradients.

Not timed: TF1-style graphs (no automatic control dependencies to run the clock's update; their
variables are saved by ``Saver``), and steps XLA compiles (it has no timestamp op).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from hvd_magic.rank import collective_time
from hvd_magic.rank.after_import import when_imported

__all__ = ["time_tensorflow", "timed"]

MODULE = "horovod.tensorflow"
CLOCK = "hvd_magic_waited"  # the variable the graph adds its waits to
PROBE = "hvd_magic_probe"  # on a GPU, the variable the gradients' probe is stored in (see _computed)
_variables: dict[str, Any] = {}  # by name: a tf.Variable, or False where it could not be made
_cpu_only: bool | None = None


def time_tensorflow() -> None:
    """Time the gradient allreduce of Horovod's TensorFlow optimizers and tapes made in this
    process: now if ``horovod.tensorflow`` is imported, else as soon as it is."""
    when_imported(MODULE, _patch)


def _patch(module: ModuleType) -> None:
    make = module._make_allreduce_grads_fn
    if getattr(make, "_hvd_magic_timed", False):
        return

    @functools.wraps(make)
    def make_timed(*args: Any, **kwargs: Any) -> Any:
        return timed(make(*args, **kwargs))

    make_timed._hvd_magic_timed = True  # type: ignore[attr-defined]
    module._make_allreduce_grads_fn = make_timed  # type: ignore[attr-defined]


def timed(allreduce: Callable[..., Any]) -> Callable[..., Any]:
    """``allreduce(gradients, ...)``, with the wait for its results added to this rank's clock."""

    @functools.wraps(allreduce)
    def timed_allreduce(gradients: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        if tf.executing_eagerly() and _on_cpu():
            collective_time.measured()
            start = time.perf_counter()
            try:
                return allreduce(gradients, *args, **kwargs)
            finally:
                collective_time.add(time.perf_counter() - start)
        clock = _variable() if tf.compat.v1.executing_eagerly_outside_functions() and not _in_xla() else None
        if clock is None:
            return allreduce(gradients, *args, **kwargs)
        with tf.control_dependencies(_computed(_tensors(gradients))):  # Horovod gets its own
            start = tf.timestamp()
        reduced = [_identity(value) for value in allreduce(gradients, *args, **kwargs)]
        with tf.control_dependencies([*_tensors(reduced), start]):
            clock.assign_add(tf.timestamp() - start)  # a stateful op: tf.function runs it
        return reduced

    return timed_allreduce


def _identity(value: Any) -> Any:
    """``value`` through an identity, for the second stamp to follow: a control edge on a
    function call's output (Horovod's allreduce is one when its optimizer was made eagerly)
    means only the call's side effects once Grappler inlines it, not its results; an identity
    that the rest of the step reads means the results."""
    import tensorflow as tf

    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(value.values), value.indices, value.dense_shape)
    return None if value is None else tf.identity(value)


def _computed(gradients: list[Any]) -> list[Any]:
    """What is there only once the gradients are computed: the gradients themselves on the
    CPU (through identities); on a GPU, the probe (see the module's note): the sum of an
    element of each, stored in a variable on the host. A store, not a value: Grappler would
    prune a value only control edges read, and with it the copy to the host."""
    import tensorflow as tf

    floating = [t for t in gradients if t.dtype.is_floating]
    probe = None if _on_cpu() or not floating else _host_variable(PROBE, tf.float32)
    if probe is None:
        return [tf.identity(t) for t in gradients]
    firsts = [tf.cast(tf.reshape(t, [-1])[:1], tf.float32) for t in floating]  # [] for an empty one
    return [probe.assign(tf.reduce_sum(tf.concat(firsts, 0)))]


def _tensors(values: Sequence[Any]) -> list[Any]:
    import tensorflow as tf

    return [v.values if isinstance(v, tf.IndexedSlices) else v for v in values if v is not None]


def _in_xla() -> bool:
    """The step is compiled by XLA (``jit_compile=True``, Horovod's XLA ops): XLA has no
    timestamp, and no host variable in the step."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    try:
        return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))
    except Exception:  # noqa: BLE001 - another TensorFlow: taken as not compiled
        return False


def _on_cpu() -> bool:
    """Whether TensorFlow sees no GPU (asked once)."""
    global _cpu_only
    if _cpu_only is None:
        import tensorflow as tf

        _cpu_only = not tf.config.list_physical_devices("GPU")
    return _cpu_only


def _variable() -> Any:
    """The clock, made once, on the CPU; None where it could not be made (then nothing is
    timed, and the step is the user's own)."""
    import tensorflow as tf

    made = CLOCK in _variables
    clock = _host_variable(CLOCK, tf.float64)
    if not made and clock is not None:
        collective_time.add_source(lambda: float(clock.numpy()))
    return clock


def _host_variable(name: str, dtype: Any) -> Any:
    """A scalar variable on the CPU, made once; None where it could not be made (not tried
    again)."""
    if name not in _variables:
        import tensorflow as tf

        _variables[name] = False
        try:
            _variables[name] = _made_apart(lambda: tf.Variable(0.0, dtype=dtype, trainable=False, name=name))
        except Exception:  # noqa: BLE001 - untimed is better than a failed step
            return None
    made = _variables[name]
    return None if made is False else made  # not `or`: a variable's truth is its value


def _made_apart(make: Callable[[], Any]) -> Any:
    """``make()`` in a thread of its own: eager, on the CPU, and out of sight of the
    ``tf.function`` being traced here (TensorFlow's variable creators are per thread), which
    would trace the user's step again for a variable made in its first trace, or refuse one
    made in a later one."""
    made: list[Any] = []

    def run() -> None:
        import tensorflow as tf

        try:
            with tf.device("/CPU:0"):
                made.append(make())
        except Exception as err:  # noqa: BLE001 - raised in the caller's thread
            made.append(err)

    thread = threading.Thread(target=run, name="hvd_magic-clock")
    thread.start()
    thread.join()
    if isinstance(made[0], Exception):
        raise made[0]
    return made[0]
