"""``TorchDistributor``: Spark's ``pyspark.ml.torch.distributor.TorchDistributor`` on hvd_magic's runs.

Change the import and nothing else::

    from hvd_magic import TorchDistributor     # was: from pyspark.ml.torch.distributor import ...

    model = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train, 1e-3)
    TorchDistributor(num_processes=4, local_mode=False).run("/path/train.py", "--lr=1e-3")

The processes are ``backend=torch`` ranks (torchrun's ``env://`` settings) with the live view,
named failures and interrupts that stop everything. Spark's semantics, kept:

- ``local_mode=True``: the processes run on this machine (``np=-N``); ``False``: one barrier
  task each on the Spark executors (``np=N``). As under Spark's (one process a task), each rank
  there has ``LOCAL_RANK=0`` and ``LOCAL_WORLD_SIZE=1``: ``cuda:LOCAL_RANK`` is the task's GPU.
- ``use_gpu=True`` is the default, and with no GPU it refuses before anything starts, as Spark's
  does: pass ``use_gpu=False`` to train on CPUs. Locally, ``num_processes`` above the GPUs torch
  sees is cut to their number (said); on Spark every task needs ``spark.task.resource.gpu.amount
  =1``. ``use_gpu=False`` on Spark hides the GPUs (``CUDA_VISIBLE_DEVICES=""``), as Spark's does.
- ``ssl_conf``: a cluster with ``spark.ssl.enabled=true`` is refused unless that Spark setting
  (``pytorch.spark.distributor.ignoreSsl`` by default) is ``true``: torch's traffic between
  ranks is not encrypted (ours with the notebook is).
- A function is called with ``*args, **kwargs`` on every rank; rank 0's return value comes back.
  A script path runs as torchrun runs it: ``sys.argv = [path, *map(str, args)]``, ``__name__ ==
  "__main__"``, its folder first on ``sys.path``; ``run`` returns None. It is read here and sent,
  so executors need no copy (a path only they have is read there).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hvd_magic.errors import CaptureError, LaunchError
from hvd_magic.options.local_ranks import LOCAL_RANKS_PER_CORE, local_load
from hvd_magic.rank.distributor import RankSetup, run_script, run_train_function

if TYPE_CHECKING:
    from hvd_magic.run.packing import Packed

__all__ = ["TorchDistributor"]

SSL_CONF = "pytorch.spark.distributor.ignoreSsl"  # Spark's TorchDistributor's default setting
GPU_AMOUNT = "spark.task.resource.gpu.amount"
_TOLD: set[str] = set()  # notes already said in this kernel: each is said once


def _once(text: str) -> list[str]:
    if text in _TOLD:
        return []
    _TOLD.add(text)
    return [text]


class TorchDistributor:
    """Runs a training function or script on ``num_processes`` torch.distributed processes,
    with the signature of Spark's ``TorchDistributor``; returns rank 0's return value.

    >>> def train(learning_rate):                                 # doctest: +SKIP
    ...     import torch.distributed as dist
    ...     dist.init_process_group("gloo")
    ...     ...
    ...     return model.state_dict()
    >>> TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train, 1e-3)  # doctest: +SKIP
    """

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        ssl_conf: str | None = None,
        *,
        _ssl_conf: str | None = None,  # the name in Spark's TorchDistributor.__init__
    ) -> None:
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes <= 0:
            raise LaunchError(
                f"TorchDistributor: num_processes must be a positive whole number, got {num_processes!r}"
            )
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.ssl_conf = ssl_conf or _ssl_conf or SSL_CONF
        self._notes: list[str] = []
        if self.ssl_conf != SSL_CONF and self.local_mode:
            self._notes += _once(
                f"TorchDistributor: ssl_conf={self.ssl_conf!r} is not used with local_mode=True "
                "(it names the Spark setting that allows a run on a TLS cluster)"
            )
        if self.use_gpu and self.local_mode:
            self.num_processes, notes = local_gpu_processes(num_processes, *_local_gpus())
            self._notes += notes
        elif self.use_gpu:
            from hvd_magic.launch.embedded_spark import active_or_embedded_session
            from hvd_magic.launch.spark_session import conf

            check_task_gpus(conf(active_or_embedded_session(), GPU_AMOUNT))

    def run(
        self, train_object: Callable[..., Any] | str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``train_object(*args, **kwargs)`` on every process and return rank 0's value, or
        run the script at path ``train_object`` with ``args`` as its command line (None)."""
        from hvd_magic.run.packing import pack_function

        setup = RankSetup(
            hide_gpus=not self.local_mode and not self.use_gpu, task_is_node=not self.local_mode
        )
        if isinstance(train_object, (str, os.PathLike)):
            path, argv, source = self._script(os.fspath(train_object), args, kwargs)
            packed = pack_function(run_script, {"path": path, "argv": argv, "source": source, "setup": setup})
        elif callable(train_object):
            call = {"train_function": train_object, "args": args, "kwargs": kwargs, "setup": setup}
            packed = pack_function(run_train_function, call)
        else:
            raise CaptureError(
                "TorchDistributor.run takes a training function or the path to a Python script, "
                f"got {type(train_object).__name__}"
            )
        notes = self._notes + ([] if self.local_mode else self._ssl_notes())
        self._notes = []
        return self._run_packed(packed, notes)

    def _script(
        self, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, list[str], str | None]:
        if kwargs:
            raise CaptureError(
                f"TorchDistributor.run({path!r}, ...): a script takes its arguments as a command line "
                f"(run(path, '--lr=1e-3')); keyword arguments ({', '.join(kwargs)}) are for functions"
            )
        argv = [path, *map(str, args)]
        try:
            with open(path, "rb") as file:
                return os.path.abspath(path), argv, importlib.util.decode_source(file.read())
        except FileNotFoundError:
            if self.local_mode:
                raise CaptureError(
                    f"the training script {path} does not exist on this machine, where local_mode=True "
                    "runs it (relative paths start at the notebook's folder)"
                ) from None
        except OSError as err:
            raise CaptureError(f"the training script {path} cannot be read: {err}") from None
        self._notes += _once(
            f"TorchDistributor: {path} is not on this machine: each rank reads it on its executor"
        )
        return path, argv, None

    def _ssl_notes(self) -> list[str]:
        from hvd_magic.launch.embedded_spark import active_or_embedded_session
        from hvd_magic.launch.spark_session import conf

        session = active_or_embedded_session()
        return ssl_notes(conf(session, "spark.ssl.enabled"), conf(session, self.ssl_conf), self.ssl_conf)

    def _run_packed(self, packed: Packed, notes: list[str]) -> Any:
        from hvd_magic.options import OptionError, make_options
        from hvd_magic.options.local_ranks import machine_cores
        from hvd_magic.run.supervisor import run_on_ranks

        np = -self.num_processes if self.local_mode else self.num_processes
        if self.local_mode:
            notes += local_process_notes(self.num_processes, machine_cores())
        try:  # the local processes are checked above, in TorchDistributor's words
            options = make_options(np=np, backend="torch", oversubscribe=True)
        except OptionError as err:
            raise LaunchError(f"TorchDistributor: {err}") from None
        options.notices += notes
        value, _ = run_on_ranks(packed, options)
        return value


def _local_gpus() -> tuple[int, str]:
    """The GPUs torch sees on this machine (``CUDA_VISIBLE_DEVICES`` counts), and why none."""
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed in the notebook's Python"
    count = int(torch.cuda.device_count())
    return count, "" if count else f"torch {torch.__version__} sees no CUDA device"


def local_gpu_processes(num_processes: int, gpus: int, why_none: str = "") -> tuple[int, list[str]]:
    """Spark's rule for ``local_mode=True, use_gpu=True``: a GPU a process; more processes than
    GPUs are cut to the GPUs (said); no GPU is refused."""
    if gpus == 0:
        raise LaunchError(
            f"TorchDistributor: use_gpu=True, but this machine has no GPU ({why_none or 'none found'}), and "
            "local_mode=True runs the processes here. use_gpu=True is the default, as in Spark's "
            "TorchDistributor, which refuses too: pass use_gpu=False to train on the CPUs (the "
            '"gloo" backend), or local_mode=False to run on GPU executors.'
        )
    if num_processes <= gpus:
        return num_processes, []
    return gpus, [
        f"TorchDistributor: num_processes={num_processes} is more than the {gpus} GPU"
        f"{'s' if gpus > 1 else ''} of this machine: {gpus} processes run, one a GPU (as in Spark)"
    ]


def check_task_gpus(amount: str | None) -> None:
    """``local_mode=False, use_gpu=True``: every task needs a GPU (Spark's rule), one here."""
    try:
        value = float(amount or "0")
    except ValueError:
        value = 0.0
    if value <= 0:
        raise LaunchError(
            f"TorchDistributor: use_gpu=True (the default, as in Spark), but the Spark session has no "
            f"{GPU_AMOUNT}, so its tasks get no GPU (Spark's TorchDistributor refuses this too). Pass "
            f"use_gpu=False to train on the executors' CPUs, or give the cluster GPUs and {GPU_AMOUNT}=1."
        )
    if value > 1:
        raise LaunchError(
            f"TorchDistributor: {GPU_AMOUNT}={amount}: Spark's TorchDistributor would start {amount} "
            "processes in each task; here every process is a task of its own. Set "
            f"{GPU_AMOUNT}=1 (num_processes tasks, a GPU each)."
        )


def ssl_notes(ssl_enabled: str | None, allowed: str | None, setting: str) -> list[str]:
    """Spark's TLS rule: a TLS cluster runs TorchDistributor only if ``setting`` is true."""
    if (ssl_enabled or "false").strip().lower() != "true":
        return []
    if (allowed or "false").strip().lower() == "true":
        return _once(
            f"TorchDistributor: this cluster has TLS on (spark.ssl.enabled) and {setting}=true lets "
            "the run go on: torch.distributed's traffic between ranks (parameters, data) is not encrypted"
        )
    raise LaunchError(
        "TorchDistributor: this cluster has TLS on (spark.ssl.enabled=true), but torch.distributed's "
        "traffic between ranks (model parameters, maybe training data) is not encrypted. To run "
        f"anyway, set {setting}=true in the Spark configuration (as with Spark's TorchDistributor)."
    )


def local_process_notes(num_processes: int, cores: int) -> list[str]:
    """Locally: far too many processes for the cores is refused (a typo); past the cores, said
    (the rule of ``np=-N``, ``local_load``, in TorchDistributor's words)."""
    load = local_load(num_processes, cores)
    if load == "thrashes":
        raise LaunchError(
            f"TorchDistributor: num_processes={num_processes} with local_mode=True would start "
            f"{num_processes:,} processes on this machine, which has {cores} CPU core{'s' * (cores > 1)}. "
            f"Use at most {LOCAL_RANKS_PER_CORE * cores} here, or local_mode=False to run them on the Spark "
            "executors."
        )
    if load == "fits":
        return []
    return _once(
        f"TorchDistributor: {num_processes} processes on this machine's {cores} CPU core"
        f"{'s' * (cores > 1)} take turns on them: fine for trying code, slower for training"
    )
