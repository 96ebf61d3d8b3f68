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
end: there the first stamp waits for a probe, an element of each gradient copied to the host,
which the host has only once the device has computed them all (a few bytes a step; Horovod's
op is done only once its result is there, so the second stamp needs none). Run eagerly on a
GPU, the same ops run one by one: the probe's copy waits for the gradients.

Not timed: TF1-style graphs (no automatic control dependencies to run the clock's update; their
variables are saved by ``Saver``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from . import collective_time
from .after_import import when_imported

__all__ = ["time_tensorflow", "timed"]

MODULE = "horovod.tensorflow"
_clock: Any = None  # the tf.Variable the graph adds its waits to; False where nothing is timed
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
        clock = _variable() if tf.compat.v1.executing_eagerly_outside_functions() else None
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
    CPU (through identities); on a GPU, a probe on the host (see the module's note)."""
    import tensorflow as tf

    if _on_cpu() or not gradients:
        return [tf.identity(t) for t in gradients]
    firsts = [tf.cast(tf.reshape(t, [-1])[:1], tf.float32) for t in gradients]  # [] for an empty one
    with tf.device("/CPU:0"):
        return [tf.identity(tf.concat(firsts, 0))]


def _tensors(values: Sequence[Any]) -> list[Any]:
    import tensorflow as tf

    return [v.values if isinstance(v, tf.IndexedSlices) else v for v in values if v is not None]


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
    global _clock
    if _clock is None:
        _clock = False
        import tensorflow as tf

        try:
            _clock = _made_apart(
                lambda: tf.Variable(0.0, dtype=tf.float64, trainable=False, name="hvd_magic_waited")
            )
        except Exception:  # noqa: BLE001 - untimed is better than a failed step
            return None
        collective_time.add_source(lambda: float(_clock.numpy()))
    return None if _clock is False else _clock


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
