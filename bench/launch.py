"""Launch benchmark: cell start -> every rank finished a trivial allreduce, np=2, warm SparkSession.

Compares hvd_magic on Spark (mpi and gloo launchers) and locally with, measured in the same run
on the same machine: bare ``horovodrun --gloo``, ``horovod.spark.run`` and Spark's
``TorchDistributor`` (where they run). Prints medians and ratios. Targets (issue 3): within 1.3x
of ``horovodrun --gloo``, at most half the time of the faster Spark peer; ``backend=torch``
(torch.distributed ranks, issue 16): at most half of TorchDistributor's time on the same
trivial torch.distributed allreduce.

Usage: python bench/launch.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from timing import median_seconds

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

SCRIPT = """
import horovod.torch as hvd, torch
hvd.init()
hvd.allreduce(torch.tensor([1.0]))
"""


def trivial_allreduce() -> float:
    import horovod.torch as hvd
    import torch

    hvd.init()
    return float(hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item())


def torch_allreduce() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value.item())


def horovodrun_gloo() -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(SCRIPT)
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    argv = [horovodrun, "--gloo", "-np", "2", sys.executable, script.name]
    subprocess.run(argv, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import contextlib
    import io

    from hvd_magic import HorovodRunner
    from hvd_magic.launch.spark import active_or_embedded_session

    session = active_or_embedded_session()
    quiet = contextlib.redirect_stdout(io.StringIO())

    def hvd_magic_run(np: int, launcher: str) -> Callable[[], object]:
        def run() -> object:
            with quiet:
                return HorovodRunner(np=np, launcher=launcher).run(trivial_allreduce)

        return run

    def torch_backend() -> object:
        with quiet:
            return HorovodRunner(np=2, backend="torch").run(torch_allreduce)

    def horovod_spark() -> object:
        import horovod.spark

        with quiet:
            return horovod.spark.run(trivial_allreduce, num_proc=2, verbose=0)

    def torch_distributor() -> object:
        from pyspark.ml.torch.distributor import TorchDistributor

        with quiet:
            return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(torch_allreduce)

    candidates: dict[str, Callable[[], object]] = {
        "horovodrun --gloo (baseline)": horovodrun_gloo,
        "hvd_magic np=2 (Spark, mpi)": hvd_magic_run(2, "mpi"),
        "hvd_magic np=2 (Spark, gloo)": hvd_magic_run(2, "gloo"),
        "hvd_magic np=-2 (local, mpi)": hvd_magic_run(-2, "mpi"),
        "hvd_magic np=2 backend=torch": torch_backend,
        "horovod.spark.run": horovod_spark,
        "TorchDistributor": torch_distributor,
    }
    results: dict[str, float] = {}
    print(f"launch benchmark: np=2, trivial allreduce, median of {args.repeat}, {os.cpu_count()} cores")
    for name, run in candidates.items():
        try:
            results[name] = median_seconds(run, args.repeat)
            print(f"  {name:32s} {results[name]:6.2f} s", flush=True)
        except Exception as err:  # noqa: BLE001 - a peer that does not run here is reported, not fatal
            print(f"  {name:32s} did not run here: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
    baseline = results.get("horovodrun --gloo (baseline)")
    peers = [results[p] for p in ("horovod.spark.run", "TorchDistributor") if p in results]
    for name in ("hvd_magic np=2 (Spark, mpi)", "hvd_magic np=2 (Spark, gloo)"):
        if name not in results:
            continue
        line = f"{name}:"
        if baseline:
            line += f" {results[name] / baseline:.2f}x horovodrun --gloo (target <= 1.3)"
        if peers:
            line += f", {results[name] / min(peers):.2f}x the faster Spark peer (target <= 0.5)"
        print(line)
    if "hvd_magic np=2 backend=torch" in results and "TorchDistributor" in results:
        ratio = results["hvd_magic np=2 backend=torch"] / results["TorchDistributor"]
        print(f"hvd_magic np=2 backend=torch: {ratio:.2f}x TorchDistributor (target <= 0.5)")
    session.stop()


if __name__ == "__main__":
    main()
