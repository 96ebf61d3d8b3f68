"""Horovod's TensorFlow gradient allreduce, timed in the graph (Horovod ranks; see
``collective_time``).

In lock-step Keras or ``DistributedGradientTape`` training a rank waits inside the graph, in
Horovod's allreduce op, for the others' gradients: Python never sees the wait. The function
Horovod makes to allreduce a step's gradients (``_make_allreduce_grads_fn``, behind
``DistributedOptimizer``, the Keras binding's optimizer and ``DistributedGradientTape``) is
wrapped: two ``tf.timestamp`` ops, one once every gradient is computed and one once every
allreduced gradient is there, and the difference added to a variable, all in the graph (no
Python in the step, no host sync). As DDP's last bucket, this times the wait after the rank's
own backward pass. On a machine whose TensorFlow sees a GPU nothing is timed (a GPU op is
"done" once queued, so the first stamp would not mark the gradients' end).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from . import collective_time
from .after_import import when_imported

__all__ = ["time_tensorflow", "timed"]

MODULE = "horovod.tensorflow"
_clock: Any = None  # the tf.Variable the graph adds its waits to; False where nothing is timed


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

        clock = _variable()
        if clock is None:
            return allreduce(gradients, *args, **kwargs)
        gradients, computed = _passed_on(gradients)
        with tf.control_dependencies(computed):
            start = tf.timestamp()
        reduced, arrived = _passed_on(allreduce(gradients, *args, **kwargs))
        with tf.control_dependencies(arrived):
            clock.assign_add(tf.timestamp() - start)  # a stateful op: tf.function runs it
        return reduced

    return timed_allreduce


def _passed_on(values: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``values`` passed on through identities, and those identities, for a stamp to follow:
    a control edge on a function call's output (Horovod's allreduce is one when its optimizer
    was made eagerly) means only the call's side effects once Grappler inlines it, not its
    results; an identity that the rest of the step reads means the results."""
    import tensorflow as tf

    passed: list[Any] = []
    for value in values:
        if isinstance(value, tf.IndexedSlices):
            value = tf.IndexedSlices(tf.identity(value.values), value.indices, value.dense_shape)
        elif value is not None:
            value = tf.identity(value)
        passed.append(value)
    ready = [v.values if isinstance(v, tf.IndexedSlices) else v for v in passed if v is not None]
    return passed, ready


def _variable() -> Any:
    """The clock, made once, in eager context, on the CPU; None where TensorFlow sees a GPU."""
    global _clock
    if _clock is None:
        import tensorflow as tf

        if tf.config.list_physical_devices("GPU"):
            _clock = False
        else:
            with tf.init_scope(), tf.device("/CPU:0"):
                _clock = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="hvd_magic_waited")
            collective_time.add_source(lambda: float(_clock.numpy()))
    return None if _clock is False else _clock
