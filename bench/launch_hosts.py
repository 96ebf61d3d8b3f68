"""Launch benchmark on the multi-host bed: np=3 across three hosts beside np=-3 on one host.

The bed (``tests/multihost.py``; root needed) runs a Spark standalone worker on each of three
hosts (Linux namespaces: own address, /tmp, hostname) and the notebook's kernel on a fourth.
In that kernel, each figure is the median wall time of ``HorovodRunner(...).run`` of a trivial
allreduce (every rank imports torch and horovod, one allreduce, exits), after a warm-up run:
``np=3`` on Spark (mpi, gloo, ``backend=torch``) against ``np=-3`` on the notebook's own host.
The hosts share this machine's cores, so the figure is launch and rendezvous cost across
hosts, not network speed. The figures are kept for the docs (``figures.py``).

Usage: sudo python bench/launch_hosts.py [--repeat 5]   (python -m tests.multihost up first
reuses a bed already up)
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
import time
from pathlib import Path

from figures import keep

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.multihost import bed_lock, notebook, running_cluster, skip_reason  # noqa: E402

CELL = """
import statistics, time, contextlib, io
from hvd_magic import HorovodRunner

def trivial_allreduce():
    import horovod.torch as hvd, torch
    hvd.init()
    return float(hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item())

def torch_allreduce():
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value.item())

def median_seconds(np, repeat, **options):
    work = torch_allreduce if options.get("backend") == "torch" else trivial_allreduce
    times = []
    for attempt in range(repeat + 1):  # the first warms up
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            HorovodRunner(np=np, **options).run(work)
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:])

{{
    "np=3 on 3 hosts (Spark, mpi)": median_seconds(3, {repeat}, launcher="mpi"),
    "np=3 on 3 hosts (Spark, gloo)": median_seconds(3, {repeat}, launcher="gloo"),
    "np=3 on 3 hosts (backend=torch)": median_seconds(3, {repeat}, backend="torch"),
    "np=-3 on 1 host (local, mpi)": median_seconds(-3, {repeat}, launcher="mpi"),
}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if reason := skip_reason():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    started = time.monotonic()
    with bed_lock() as held:
        if not held:
            print("the multi-host bed stayed in use by another process", file=sys.stderr)
            return 1
        log_dir = Path(tempfile.mkdtemp(prefix="hvd_magic-bench-hosts-"))
        with running_cluster(log_dir) as cluster, notebook(cluster) as kernel:
            print(f"the bed is up in {time.monotonic() - started:.0f} s; measuring ...", flush=True)
            outcome = kernel.run(CELL.format(repeat=args.repeat), timeout=1800)
            if outcome.status != "ok":
                print(f"the benchmark cell failed: {outcome.ename}: {outcome.evalue}", file=sys.stderr)
                return 1
    results: dict[str, float] = ast.literal_eval(outcome.value)
    print(f"launch benchmark on the multi-host bed: trivial allreduce, median of {args.repeat}")
    for name, seconds in results.items():
        print(f"  {name:34s} {seconds:6.2f} s")
    single = results["np=-3 on 1 host (local, mpi)"]
    for name, seconds in results.items():
        if "3 hosts" in name:
            print(f"{name}: {seconds / single:.2f}x np=-3 on one host")
    keep("launch_hosts", {FIGURE_NAMES[name]: f"{seconds:.2f} s" for name, seconds in results.items()})
    return 0


FIGURE_NAMES = {  # the docs' names for the cell's figures
    "np=3 on 3 hosts (Spark, mpi)": "spark_mpi",
    "np=3 on 3 hosts (Spark, gloo)": "spark_gloo",
    "np=3 on 3 hosts (backend=torch)": "spark_torch",
    "np=-3 on 1 host (local, mpi)": "local_mpi",
}


if __name__ == "__main__":
    sys.exit(main())
