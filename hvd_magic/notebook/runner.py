"""``HorovodRunner``: the function API, for people leaving ``sparkdl.HorovodRunner``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hvd_magic.options import OptionError, make_options
from hvd_magic.options.option import RUNNER
from hvd_magic.options.run_options import keywords
from hvd_magic.run.packing import pack_function
from hvd_magic.run.supervisor import run_on_ranks

__all__ = ["HorovodRunner"]


class HorovodRunner:
    """Runs a function as a Horovod job and returns rank 0's return value.

    >>> def main(lr):                                   # doctest: +SKIP
    ...     import horovod.torch as hvd
    ...     hvd.init()
    ...     return hvd.rank()
    >>> HorovodRunner(np=-2).run(main, lr=0.1)          # doctest: +SKIP
    0

    ``np=-N`` runs N ranks on this machine, ``np=N`` on the Spark cluster.
    ``backend="torch"`` runs torch.distributed ranks (``init_process_group`` finds its
    ``env://`` settings) instead of Horovod. ``data=df`` (a Spark,
    pandas or Arrow DataFrame) gives each rank its shard: ``hvd_magic.shard()`` in ``main``.
    ``logdir="logs"`` writes the reported metrics as TensorBoard event files (a folder per run);
    ``mlflow=True`` logs the run to MLflow (starting an MLflow run if none is active; by default
    it logs when one is). ``stragglers="0.7/10"`` (the default) names a rank whose steps/s stays
    below 70 % of the ranks' median for 10 s, with its likely reason; ``"off"`` does not watch.
    ``driver_log_verbosity`` is accepted for compatibility with sparkdl
    and ignored: rank output is always streamed.
    """

    def __init__(
        self,
        np: int,
        driver_log_verbosity: str = "all",
        *,
        launcher: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        timeline: str | None = None,
        data: Any = None,
        remainder: str | None = None,
        backend: str | None = None,
        oversubscribe: bool = False,
        retries: int = 0,
        min_np: int | None = None,
        resize_wait: float | None = None,
        checkpoint_dir: str | None = None,
        logdir: str | None = None,
        mlflow: bool | None = None,
        stragglers: str | None = None,
    ) -> None:
        try:  # the keywords are the table's for HorovodRunner (tests/test_options_table.py holds them)
            self.options = make_options(**keywords(RUNNER, locals()))
        except OptionError as err:
            raise ValueError(str(err)) from None
        self.num_processor = abs(self.options.np)

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return rank 0's return value."""
        value, _ = run_on_ranks(pack_function(main, kwargs), self.options)
        return value
