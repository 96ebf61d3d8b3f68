"""Keeping a long run's work from a rank: ``checkpoint``, ``resume`` and ``stopping``.

>>> state = hvd_magic.resume() or {"step": 0, "model": model.state_dict()}     # doctest: +SKIP
>>> model.load_state_dict(state["model"])
>>> for step in range(state["step"], steps):
...     train_step()
...     if step % 100 == 0:
...         hvd_magic.checkpoint({"step": step, "model": model.state_dict()}, step=step)
...     if hvd_magic.stopping():                      # every rank, at the same place
...         hvd_magic.checkpoint({"step": step, "model": model.state_dict()}, step=step)
...         break

Outside a run each is harmless: ``checkpoint`` returns False, ``resume`` None, ``stopping``
False.
"""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle

from hvd_magic.protocol import KeptRequest, Polling, ResumeRequest
from hvd_magic.protocol.files import checkpoint_name
from hvd_magic.rank import inbox as rank_inbox
from hvd_magic.rank import reporting

__all__ = ["checkpoint", "resume", "stopping"]

RESUME_TIMEOUT = 300.0
KEPT_TIMEOUT = 300.0  # a checkpoint's last chunk sent, to kept (written, and copied to a URL)
_polling_told = False
_agreed = False  # the ranks agreed to stop: later calls say so without a collective, on every rank


def checkpoint(state: Any, step: int, wait: bool = False) -> bool:
    """On rank 0: send ``state`` (anything picklable: state_dicts, optimizer state, numbers) to
    the notebook, where it is kept whole (written, then renamed) in the run's checkpoint folder
    (``checkpoint_dir=``), the last 3 kept. Other ranks: nothing (False), so every rank may call
    it. A retried run's ranks find it with ``resume()``.

    It returns once the state is pickled and on its way: training goes on while it travels, and
    a rank killed meanwhile leaves the previous checkpoint the latest. ``wait=True`` returns once
    the notebook kept it (True), or False if it could not say so within 5 minutes: before a
    planned exit, or when a notice says the machine is about to go."""
    reporter = reporting.current()
    if reporter is None or reporter.client.rank != 0:
        return False
    # pickled here (a snapshot: training may change the tensors next), sent in the background
    if not reporting.send_file_soon(checkpoint_name(int(step)), cloudpickle.dumps(state)):
        return False
    if not wait:
        return True
    reporter.files.join()  # every chunk queued on the connection, in order, before the question
    try:
        answer = reporter.client.ask(KeptRequest(0, int(step)), b"", KEPT_TIMEOUT)
    except TimeoutError:
        return False
    return bool(getattr(answer.record, "kept", False))


def resume() -> Any:
    """The latest checkpoint's state, on every rank; None on a fresh start (or outside a run)."""
    reporter = reporting.current()
    if reporter is None:
        return None
    answer = reporter.client.ask(ResumeRequest(0), b"", RESUME_TIMEOUT)
    if not getattr(answer.record, "found", False):
        return None
    return cloudpickle.loads(answer.blob)


def stopping() -> bool:
    """Whether the notebook asked the run to stop (its first interrupt, or a preemption notice:
    Spark decommissioning an executor of the run, said on stderr). A collective: every
    rank calls it at the same place in its loop, and all get the same answer, so that no rank
    leaves a collective the others are in. Then write a final checkpoint and leave the loop;
    the cell returns rank 0's value."""
    global _polling_told, _agreed
    inbox, reporter = rank_inbox.current(), reporting.current()
    if inbox is None or reporter is None:
        return False
    if _agreed:
        return True
    if not _polling_told:
        _polling_told = True
        reporter.client.send(Polling())
    _agreed = _any_rank(inbox.stop_asked.is_set())
    if _agreed and inbox.stop_reason:
        print(f"hvd_magic: stopping: {inbox.stop_reason}", file=sys.stderr, flush=True)
    return _agreed


def _any_rank(flag: bool) -> bool:
    """``flag`` OR-ed over the ranks, with the framework the ranks run."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        import torch

        on_gpu = dist.get_backend() == "nccl"  # NCCL reduces CUDA tensors only
        value = torch.tensor([float(flag)], device=torch.cuda.current_device() if on_gpu else "cpu")
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        import torch

        return bool(hvd.allreduce(torch.tensor([float(flag)]), op=hvd.Max, name="hvd_magic.stopping").item())
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None and hvd.is_initialized():
        import tensorflow as tf

        return bool(hvd.allreduce(tf.constant([float(flag)]), op=hvd.Max, name="hvd_magic.stopping")[0])
    return flag
