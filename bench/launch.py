"""Launch benchmark: cell start -> every rank finished a trivial allreduce, np=2, warm SparkSession.

Compares hvd_magic on Spark (mpi and gloo launchers) and locally with, measured in the same run
on the same machine: bare ``horovodrun --gloo``, ``horovod.spark.run`` and Spark's
``TorchDistributor`` (where they run). Prints medians and ratios. Targets (issue 3): within 1.3x
of ``horovodrun --gloo``, at most half the time of the faster Spark peer; ``backend=torch``
(torch.distributed ranks, issue 16): at most half of TorchDistributor's time on the same
trivial torch.distributed allreduce; Spark's cold cell within 1.3x of the same cell locally
(issue 77). The figures are kept for the docs (``figures.py``).

Usage: python bench/launch.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from figures import keep
from timing import in_turn, median_seconds

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

WARM_UP = 5  # rounds of the paired cells before any is timed

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


def bare_mpirun() -> None:
    """The floor of a cold launch on this host: mpirun starting two fresh Pythons that import torch
    and Horovod, initialise and allreduce (hvd_magic's local ranks are forked warm instead)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(SCRIPT)
    transport = ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"]  # as hvd_magic's own mpirun
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", *transport]
    argv = [*mpirun, sys.executable, script.name]
    try:
        subprocess.run(argv, check=True, capture_output=True)
    finally:
        os.unlink(script.name)


def cold_cell(np: int, launcher: str | None = None) -> Callable[[], object]:
    """A cold ``HorovodRunner(np=...)`` run of the trivial allreduce, its output kept from the screen."""
    import contextlib
    import io

    import cloudpickle

    from hvd_magic import HorovodRunner

    if __name__ != "__main__":  # imported (by the suite's guards): the ranks cannot import this file
        cloudpickle.register_pickle_by_value(sys.modules[__name__])

    def run() -> object:
        with contextlib.redirect_stdout(io.StringIO()):
            return HorovodRunner(np=np, launcher=launcher).run(trivial_allreduce)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import contextlib
    import io

    from hvd_magic import HorovodRunner
    from hvd_magic.launch.embedded_spark import active_or_embedded_session

    session = active_or_embedded_session()
    quiet = contextlib.redirect_stdout(io.StringIO())

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
        "bare mpirun np=2 (local floor)": bare_mpirun,
        "hvd_magic np=2 (Spark, mpi)": cold_cell(2, "mpi"),
        "hvd_magic np=2 (Spark, gloo)": cold_cell(2, "gloo"),
        "hvd_magic np=-2 (local, mpi)": cold_cell(-2, "mpi"),
        "hvd_magic np=-2 (local, gloo)": cold_cell(-2, "gloo"),
        "hvd_magic np=2 backend=torch": torch_backend,
        "horovod.spark.run": horovod_spark,
        "TorchDistributor": torch_distributor,
    }
    # Spark's cells and the same cells here, in turn: a ratio of two runs of the same moment,
    # once the cluster is warm (a new JVM's first jobs run slower: JIT) and the fork servers are up
    paired = [name for pair in SAME_CELL_HERE.items() for name in pair]
    results: dict[str, float] = {}
    print(f"launch benchmark: np=2, trivial allreduce, median of {args.repeat}, {os.cpu_count()} cores")
    timed = in_turn({name: candidates[name] for name in paired}, args.repeat, warm_up=WARM_UP)
    for name, seconds in timed.items():
        results[name] = seconds
        print(f"  {name:32s} {seconds:6.2f} s", flush=True)
    for name, run in candidates.items():
        if name in results:
            continue
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
    for name, here in SAME_CELL_HERE.items():
        if name in results and here in results:
            ratio = results[name] / results[here]
            print(f"{name}: {ratio:.2f}x the same cell locally (target <= 1.3, issue 77)")
    if "hvd_magic np=2 backend=torch" in results and "TorchDistributor" in results:
        ratio = results["hvd_magic np=2 backend=torch"] / results["TorchDistributor"]
        print(f"hvd_magic np=2 backend=torch: {ratio:.2f}x TorchDistributor (target <= 0.5)")
    keep("launch", launch_figures(results))
    session.stop()


FIGURE_NAMES = {  # the docs' names for the candidates' figures
    "horovodrun --gloo (baseline)": "horovodrun_gloo",
    "bare mpirun np=2 (local floor)": "bare_mpirun",
    "hvd_magic np=2 (Spark, mpi)": "spark_mpi",
    "hvd_magic np=2 (Spark, gloo)": "spark_gloo",
    "hvd_magic np=-2 (local, mpi)": "local_mpi",
    "hvd_magic np=-2 (local, gloo)": "local_gloo",
    "hvd_magic np=2 backend=torch": "spark_torch",
    "horovod.spark.run": "horovod_spark",
    "TorchDistributor": "torch_distributor",
}


SAME_CELL_HERE = {  # a cell on Spark, and the same cell here: the same launcher (issue 77)
    "hvd_magic np=2 (Spark, mpi)": "hvd_magic np=-2 (local, mpi)",
    "hvd_magic np=2 (Spark, gloo)": "hvd_magic np=-2 (local, gloo)",
}


def launch_figures(results: dict[str, float]) -> dict[str, str]:
    figures = {FIGURE_NAMES[name]: f"{seconds:.2f} s" for name, seconds in results.items()}
    for name, here in SAME_CELL_HERE.items():
        if name in results and here in results:
            figures[f"{FIGURE_NAMES[name]}_local"] = f"{results[name] / results[here]:.2f}x"
    if "hvd_magic np=2 backend=torch" in results and "TorchDistributor" in results:
        figures["spark_torch_distributor"] = (
            f"{results['hvd_magic np=2 backend=torch'] / results['TorchDistributor']:.2f}x"
        )
    return figures


if __name__ == "__main__":
    main()
