"""Telemetry benchmark: what a rank's resource sample costs, against the second between beats.

A rank samples once a beat (``BEAT_SECONDS``): its process tree's CPU % and RSS (psutil) and,
with a GPU, one NVML query. The figure is the sample's median time, in a process with the
children a rank has (here: 4 busy children), as a share of the beat interval: the part of a
core it takes from training. Target (issue 29): <= 1 %. The figures are kept for the docs
(``figures.py``).

Usage: python bench/telemetry.py [--samples 500]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from figures import keep

from hvd_magic.rank.telemetry import ResourceSampler, gpu_probe
from hvd_magic.run.supervisor import BEAT_SECONDS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    args = parser.parse_args()
    busy = "import time\nend = time.time() + 120\nwhile time.time() < end: pass"
    children = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(4)]
    try:
        sampler = ResourceSampler(gpu_probe())
        sampler.sample()
        times = []
        for _ in range(args.samples):
            started = time.perf_counter()
            sampler.sample()
            times.append(time.perf_counter() - started)
    finally:
        for child in children:
            child.kill()
    median = statistics.median(times)
    share = 100 * median / BEAT_SECONDS
    gpu = "with" if sampler.gpu is not None else "without"
    print(f"telemetry: a sample of a rank with 4 children, {gpu} a GPU, median of {args.samples}")
    print(f"  one sample                  {1e6 * median:8.0f} us")
    print(f"  share of a core at one a {BEAT_SECONDS:.0f} s  {share:8.3f} %   target <= 1 %")
    keep("telemetry", {"sample": f"{1e6 * median:.0f} µs", "share": f"{share:.3f} %"})


if __name__ == "__main__":
    main()
