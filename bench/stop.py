"""Stop benchmark: interrupt -> the cell returned, and interrupt -> every process of the run gone.

np=2 ranks that init Horovod and wait. Measured in the same run: hvd_magic locally (mpi, gloo)
and on an embedded local Spark session, against bare ``mpirun`` interrupted with SIGINT (the
time until mpirun and its ranks are gone) as the baseline. Target (issue 11): the cell returns
within 5 s of the interrupt on an idle machine, with nothing left when it does. The figures are
kept for the docs (``figures.py``).

Usage: python bench/stop.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from figures import keep

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import run_processes_anywhere, wait_for_ranks, waiting_cell  # noqa: E402


def _gone_at(deadline: float = 60.0) -> float:
    end = time.monotonic() + deadline
    while run_processes_anywhere() and time.monotonic() < end:
        time.sleep(0.005)
    return time.monotonic()


def hvd_magic_stop(np: int, launcher: str) -> tuple[float, float]:
    """(interrupt -> cell returned, interrupt -> all gone) for one %%horovod run."""
    from timing import QuietView

    from hvd_magic import RunInterrupted
    from hvd_magic.options import make_options
    from hvd_magic.run.packing import pack_cell
    from hvd_magic.run.supervisor import run_on_ranks

    directory = Path(tempfile.mkdtemp())
    interrupted: list[float] = []

    def interrupt() -> None:
        if wait_for_ranks(directory, abs(np), timeout=300):
            interrupted.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        run_on_ranks(
            pack_cell(waiting_cell(directory), {}), make_options(np=np, launcher=launcher), QuietView()
        )
    except RunInterrupted:
        returned = time.monotonic()
    return returned - interrupted[0], _gone_at() - interrupted[0]


def bare_mpirun_stop(np: int) -> tuple[float, float]:
    directory = Path(tempfile.mkdtemp())
    script = directory / "wait.py"
    script.write_text(waiting_cell(directory))
    argv = ["mpirun", "--allow-run-as-root", "-np", str(np), "--oversubscribe", sys.executable, str(script)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_ranks(directory, np, timeout=300)
    family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    process.wait()
    returned = time.monotonic()
    psutil.wait_procs(family, timeout=60)
    return returned - started, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    cases = {
        "bare mpirun, SIGINT (baseline)": lambda: bare_mpirun_stop(2),
        "hvd_magic np=-2 mpi": lambda: hvd_magic_stop(-2, "mpi"),
        "hvd_magic np=-2 gloo": lambda: hvd_magic_stop(-2, "gloo"),
        "hvd_magic np=2 on Spark (mpi)": lambda: hvd_magic_stop(2, "mpi"),
        "hvd_magic np=2 on Spark (gloo)": lambda: hvd_magic_stop(2, "gloo"),
    }
    results = {}
    for name, run in cases.items():
        samples = [run() for _ in range(repeat)]
        results[name] = (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))
    baseline = results["bare mpirun, SIGINT (baseline)"][1]
    print(f"{'':34} {'to prompt':>10} {'all gone':>10} {'vs baseline':>12}")
    for name, (prompt, gone) in results.items():
        print(f"{name:34} {prompt:9.2f}s {gone:9.2f}s {gone / baseline:11.2f}x")
    worst = max(prompt for name, (prompt, _) in results.items() if "hvd_magic" in name)
    print(
        f"target: cell returns within 5 s of the interrupt: worst median {worst:.2f} s "
        f"({'met' if worst <= 5 else 'NOT met'}); 'all gone' equals 'to prompt' when the stop is complete"
    )
    mpirun_prompt, mpirun_gone = results["bare mpirun, SIGINT (baseline)"]
    ours = [prompt for name, (prompt, _) in results.items() if "hvd_magic" in name]
    figures = {
        "mpirun_prompt": f"{mpirun_prompt:.2f} s",
        "mpirun_lingers": f"{mpirun_gone - mpirun_prompt:.2f} s",
        "fastest": f"{min(ours):.2f} s",
        "slowest": f"{worst:.2f} s",
    }
    keep("stop", figures)


if __name__ == "__main__":
    main()
