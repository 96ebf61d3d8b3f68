"""horovod.spark's ways of saying where and on how many ranks to train, mapped onto ours:
``backend=`` (its ``num_proc``), no ``num_proc`` at all (Spark's default parallelism, as
horovod.spark's ``SparkBackend`` takes it), ``store=`` + ``run_id=`` (the run's folder, which is
our ``model_dir``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pyspark.ml.param import Params

__all__ = ["Destination", "backend_notes", "destination", "num_proc", "rank_env"]


def num_proc(estimator: Params, dataset: Any) -> int:
    """The ranks: ``num_proc``, else ``backend``'s, else Spark's default parallelism."""
    name = type(estimator).__name__
    backend = estimator.getOrDefault("backend")
    if backend is not None:
        if estimator.isSet("num_proc"):
            raise ValueError(
                f"{name}: give num_proc= or backend=, not both (as in horovod.spark): "
                "backend=SparkBackend(num_proc=N) already says N ranks"
            )
        if not callable(getattr(backend, "num_processes", None)):
            raise TypeError(
                f"{name}: backend= takes horovod.spark's SparkBackend, got {type(backend).__name__}"
            )
        return int(backend.num_processes())
    if estimator.isDefined("num_proc"):
        return int(estimator.getOrDefault("num_proc"))
    parallelism = _default_parallelism(dataset)
    if parallelism is None:
        raise ValueError(f"{name} needs num_proc=: N ranks on the Spark cluster, or -N on this machine")
    return parallelism


def _default_parallelism(dataset: Any) -> int | None:
    session = getattr(dataset, "sparkSession", None)
    try:
        return int(session.sparkContext.defaultParallelism)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext; read its setting instead
        pass
    try:
        value = session.conf.get("spark.default.parallelism", None)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - no session at all (a pandas frame): nothing to go by
        return None
    return int(value) if value else None


def backend_notes(estimator: Params) -> list[str]:
    """What a SparkBackend was given besides num_proc and env (output streams, timestamps ...)."""
    backend = estimator.getOrDefault("backend")
    settings = sorted(getattr(backend, "_kwargs", None) or {})
    if backend is None or not settings:
        return []
    return [
        f"{type(estimator).__name__}: backend= gives its num_proc and env; its {', '.join(settings)} "
        "are not used (the ranks' output comes to this cell)."
    ]


def rank_env(estimator: Params) -> dict[str, str]:
    """Variables for the ranks: a SparkBackend's ``env`` where it differs from this process's
    environment (horovod.spark gave the ranks all of it), and KerasEstimator's ``backend_env``."""
    import os

    backend = estimator.getOrDefault("backend")
    given = dict(getattr(backend, "_env", None) or {})
    given.pop("CUDA_VISIBLE_DEVICES", None)  # as SparkBackend.run drops it: each rank is given its GPU
    env = {name: str(value) for name, value in given.items() if os.environ.get(name) != str(value)}
    if estimator.hasParam("backend_env") and estimator.isSet("backend_env"):
        env |= {name: str(value) for name, value in (estimator.getOrDefault("backend_env") or {}).items()}
    return env


@dataclass
class Destination:
    """Where a fit's files go: ``location`` (a folder or URL, or None: nowhere), through
    ``filesystem`` (a Store's fsspec file system, with its storage options) when there is one."""

    location: str | None
    filesystem: Any
    run_id: str | None


def destination(estimator: Params, framework: str) -> Destination:
    """``model_dir``, or the run folder of ``store`` (``prefix/runs/run_id``, as horovod.spark
    lays it out: a second fit with the same ``run_id`` resumes from its checkpoints)."""
    name = type(estimator).__name__
    store = estimator.getOrDefault("store")
    run_id = estimator.getOrDefault("run_id") if estimator.isDefined("run_id") else None
    model_dir = estimator.getOrDefault("model_dir") if estimator.isDefined("model_dir") else None
    if store is None:
        return Destination(model_dir, None, run_id)
    if model_dir:
        raise ValueError(f"{name}: give store= or model_dir=, not both (both say where the run's files go)")
    run_id = run_id or f"{framework}_{int(time.time())}"  # horovod.spark's default run_id
    if isinstance(store, str):
        return Destination(f"{store.rstrip('/')}/runs/{run_id}", None, run_id)
    if callable(getattr(store, "get_run_path", None)):
        return Destination(str(store.get_run_path(run_id)), getattr(store, "fs", None), run_id)
    if isinstance(getattr(store, "prefix_path", None), str):
        return Destination(
            f"{store.prefix_path.rstrip('/')}/runs/{run_id}", getattr(store, "fs", None), run_id
        )
    raise TypeError(
        f"{name}: store= takes horovod.spark's Store (Store.create(path)), or a path or URL; "
        f"got {type(store).__module__}.{type(store).__qualname__}"
    )
