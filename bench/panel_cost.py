"""What being served to the Horovod panel costs a run's kernel (issue 78), printing figures
measured in this run. The kernel side of ``bench/live_view.py`` (64 simulated ranks, 100 reports/s
each, the real hub, supervision, live view and run record) runs with the kernel's run endpoint
serving, and the CPU its serving thread used is set against the kernel's over the same run:
  - no one asking (a run no one watches): target <= 1 % of the kernel's CPU, nothing measurable;
  - asked as an open panel and the run's tab ask (the run list and the run's view each second):
    target <= 10 %.
Both sides are measured in the same run (a thread's own CPU time), so a loaded machine moves
neither; the other cost, the model's lock at each message, is about 0.2 us a message. Medians of rounds.
(A first version compared the kernel's CPU share across runs with and without the endpoint: one
short sample each way varied by a fifth under the suite's load, and its guard failed on noise.)

Usage: python bench/panel_cost.py [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import zmq
from figures import keep
from live_view import kernel_side

from hvd_magic.protocol.panel import endpoint_folder
from hvd_magic.run.endpoint import RunEndpoint
from hvd_magic.run.history import HISTORY

WAYS = ("unwatched", "watched")


@contextmanager
def served(watched: bool) -> Iterator[RunEndpoint]:
    """The kernel's endpoint for the block; ``watched``: asked as the panel asks, each second."""
    endpoint = RunEndpoint(HISTORY, endpoint_folder(tempfile.mkdtemp()), "bench")
    done = threading.Event()

    def panel() -> None:
        context = zmq.Context()
        socket = context.socket(zmq.REQ)
        socket.connect(endpoint.endpoint.address)
        token = endpoint.endpoint.token
        while not done.wait(1.0):
            for ask in ({"ask": "runs"}, {"ask": "run", "number": HISTORY.count, "per_rank": False}):
                socket.send_json(ask | {"token": token})
                json.loads(socket.recv())
        socket.close(linger=0)
        context.term()

    asking = threading.Thread(target=panel, daemon=True)
    if watched:
        asking.start()
    try:
        yield endpoint
    finally:
        done.set()
        if watched:
            asking.join(timeout=10)
        endpoint.close()


def shares(seconds: float, rounds: int, ranks: int = 64, rate: int = 100) -> dict[str, float]:
    """The serving thread's median share of the kernel's CPU over a run, each way (``WAYS``)."""
    found: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            with served(way == "watched") as endpoint:
                began, cpu = time.monotonic(), endpoint.cpu
                side = kernel_side(ranks, seconds, rate)
                kernel = side["cpu"] * (time.monotonic() - began)  # its CPU seconds, near enough
                found[way].append((endpoint.cpu - cpu) / kernel)
    return {way: statistics.median(values) for way, values in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    found = shares(args.seconds, args.rounds)
    print(f"the panel's cost to the kernel, 64 simulated ranks x 100 reports/s, medians of {args.rounds}:")
    for way, share in found.items():
        print(f"  {way:10s} the serving thread: {share:6.2%} of the kernel's CPU")
    print("  target: unwatched <= 1 % (nothing measurable), watched <= 10 %")
    keep("panel_cost", {way: f"{share:.2%}" for way, share in found.items()})


if __name__ == "__main__":
    main()
