"""Live-view benchmarks (issue 4), printing figures measured in this run.

(a) Training cost: steps/s of a small torch loop on 2 local ranks, with ``hvd_magic.report``
    at every step (about 100 reports/s/rank) against the same loop without it.
    Target: <= 1 % slower.
(b) Kernel side: 64 simulated ranks (a separate process, real hub connections and the real
    report buffer) send 100 reports/s each; the notebook side runs the real hub, engine pump and
    live view. Target: 0 reports lost, <= 10 UI updates/s, kernel CPU <= 30 %.

Usage: python bench/live_view.py [--seconds 60] [--ranks 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import time

import psutil
from figures import keep

from hvd_magic.errors import RunError
from hvd_magic.hub import Hub
from hvd_magic.launch import Launcher
from hvd_magic.options import make_options
from hvd_magic.run.recording import recorded_sinks
from hvd_magic.run.supervisor import Run
from hvd_magic.widgets.live_view import LiveView

SIMULATOR = """
import os, sys, time
from hvd_magic.rank.hub_client import HubClient
from hvd_magic.rank import reporting
from hvd_magic.protocol import Exit, Started
address, token = sys.argv[1], sys.argv[2]
ranks, seconds, rate = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
reporters = [reporting.Reporter(HubClient(address, token, rank)) for rank in range(ranks)]
for rank, reporter in enumerate(reporters):  # as a rank does first: the run then waits for its exit
    reporter.client.send(Started("simulated", os.getpid(), rank, ranks))
start, sent, total = time.monotonic(), 0, int(seconds * rate)
while (now := time.monotonic()) - start < seconds:
    due = int((now - start) * rate) + 1
    for step in range(sent + 1, due + 1):
        for rank, reporter in enumerate(reporters):
            record = {"t": time.time(), "step": step, "total": total, "metrics": {"loss": 1.0 / step}}
            reporter.add(record)
    sent = due
    time.sleep(0.005)
for reporter in reporters:
    reporter.close()
    reporter.client.send(Exit(0))
    reporter.client.close()
print(sent * ranks, sum(r.dropped for r in reporters))
"""


class Simulated(Launcher):
    """The simulator process as a run's launcher: its ranks are the simulated ones."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def start(self, hub: Hub, env: dict[str, str]) -> None:
        pass

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self) -> list[str]:
        self.process.kill()
        return []


def kernel_side(ranks: int, seconds: float, rate: int) -> dict[str, float]:
    """The run's real supervision (``Run``: hub, pump, record, straggler watch, live view, the
    kernel's record of the run) fed by the simulator until it ends; the run then fails (no rank
    sent a result), as expected.
    Returns the reports sent, dropped at the ranks and lost, the UI updates a second and the
    kernel's CPU as a share of one core."""
    hub = Hub("127.0.0.1", b"")
    view = LiveView(ranks, show=False)
    me = psutil.Process()
    command = [sys.executable, "-c", SIMULATOR, hub.address, hub.keys.client_token()]
    simulator = subprocess.Popen(
        [*command, str(ranks), str(seconds), str(rate)], stdout=subprocess.PIPE, text=True
    )
    options = make_options(np=ranks)
    sinks = recorded_sinks(options)  # as a run has them: the kernel's record of it folds them too
    run = Run(hub, Simulated(simulator), sinks.shown_in(view), options, sinks=sinks)
    cpu_before, started = me.cpu_times(), time.monotonic()
    with sinks, contextlib.suppress(RunError):
        run.supervise()
    wall = time.monotonic() - started
    cpu_after = me.cpu_times()
    sent, dropped = map(int, simulator.stdout.read().split())  # type: ignore[union-attr]
    cpu = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) / wall
    lost = sent - dropped - view.model.reports
    return {"sent": sent, "dropped": dropped, "lost": lost, "updates": view.updates / wall, "cpu": cpu}


def print_kernel_side(ranks: int, seconds: float, rate: int, side: dict[str, float]) -> None:
    print(f"(b) kernel side, {ranks} simulated ranks x {rate} reports/s for {seconds:.0f} s:")
    sent, dropped, lost = side["sent"], side["dropped"], side["lost"]
    print(f"    reports sent {sent:.0f}, dropped at the ranks {dropped:.0f}, lost {lost:.0f}")
    print(f"    UI updates {side['updates']:.1f}/s (target <= 10)")
    print(f"    kernel CPU {side['cpu']:.1%} of one core (target <= 30 %)")


TRAIN = """
import time, torch, hvd_magic, horovod.torch as hvd
def main(report, steps):
    hvd.init()
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    start = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if report:
            hvd_magic.report(step=step + 1, total=steps, loss=loss.item())
    return steps / (time.perf_counter() - start)
"""


def training_cost(rounds: int, steps: int) -> dict[str, str]:
    from hvd_magic import HorovodRunner

    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(TRAIN, "<bench>", "exec"), namespace)
    main = namespace["main"]
    runner = HorovodRunner(np=-2)
    with_report, without = [], []
    for _ in range(rounds):  # interleaved, so drift in machine load hits both alike
        with contextlib.redirect_stdout(io.StringIO()):
            without.append(runner.run(main, report=False, steps=steps))
            with_report.append(runner.run(main, report=True, steps=steps))
    a, b = statistics.median(without), statistics.median(with_report)
    print(f"(a) training, 2 local ranks, median of {rounds} interleaved runs of {steps} steps:")
    print(f"    without report {a:.0f} steps/s, with report at every step {b:.0f} steps/s")
    print(f"    cost {(a - b) / a:+.2%} (target <= 1 %)")
    from hvd_magic.rank import reporting
    from hvd_magic.rank.hub_client import HubClient

    hub = Hub("127.0.0.1", b"")
    client = HubClient(hub.address, hub.keys.client_token(), 0)
    reporting.attach(client)
    calls = 100_000
    started = time.perf_counter()
    for step in range(calls):
        reporting.report(step=step, total=calls, loss=0.5)
    per_call = (time.perf_counter() - started) / calls
    reporting.detach()
    client.close()
    hub.close()
    share = per_call * 100
    print(f"    one report() call: {per_call * 1e6:.1f} us = {share:.3%} of a second at 100 reports/s")
    return {"training_cost": f"{(a - b) / a:+.1%}", "report_call": f"{per_call * 1e6:.1f} µs"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    print(f"live view benchmark on {os.cpu_count()} cores")
    figures = training_cost(args.rounds, args.steps)
    side = kernel_side(args.ranks, args.seconds, args.rate)
    print_kernel_side(args.ranks, args.seconds, args.rate, side)
    figures |= {
        "updates": f"{side['updates']:.1f}",
        "kernel_cpu": f"{side['cpu']:.0%}",
        "lost": f"{side['lost']:.0f}",
    }
    keep("live_view", figures)


if __name__ == "__main__":
    main()
