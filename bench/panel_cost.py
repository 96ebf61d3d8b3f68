"""What being served to the Horovod panel costs a run's kernel (issue 78), printing figures
measured in this run: the kernel side of ``bench/live_view.py`` (64 simulated ranks, 100 reports/s
each, the real hub, supervision, live view and run record), its CPU share of one core
  - without the kernel's run endpoint,
  - with it serving, no one asking (a run no one watches): target 1.02x at most, nothing measurable,
  - with it asked as an open panel and the run's tab ask (the run list and the run's view, each
    second; the asking thread is this process's too, so its share counts against the kernel).
Rounds in turn, so that drift in the machine's load falls on each alike; medians.

Usage: python bench/panel_cost.py [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import zmq
from figures import keep
from live_view import kernel_side

from hvd_magic.protocol.panel import endpoint_folder
from hvd_magic.run.endpoint import RunEndpoint
from hvd_magic.run.history import HISTORY

WAYS = ("not served", "served, unwatched", "served, watched")


@contextmanager
def served(watched: bool) -> Iterator[None]:
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
        yield
    finally:
        done.set()
        if watched:
            asking.join(timeout=10)
        endpoint.close()


def shares(seconds: float, rounds: int, ranks: int = 64, rate: int = 100) -> dict[str, float]:
    """The kernel's median CPU share of one core, each way (``WAYS``)."""
    found: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        found[WAYS[0]].append(kernel_side(ranks, seconds, rate)["cpu"])
        for way, watched in zip(WAYS[1:], (False, True), strict=True):
            with served(watched):
                found[way].append(kernel_side(ranks, seconds, rate)["cpu"])
    return {way: statistics.median(values) for way, values in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    found = shares(args.seconds, args.rounds)
    base = found[WAYS[0]]
    print(f"the panel's cost to the kernel, 64 simulated ranks x 100 reports/s, medians of {args.rounds}:")
    for way, share in found.items():
        print(f"  {way:18s} kernel CPU {share:6.1%} of one core = {share / base:5.2f}x")
    print("  target: unwatched <= 1.02x (nothing measurable), watched <= 1.10x")
    keep(
        "panel_cost",
        {"unwatched": f"{found[WAYS[1]] / base:.2f}x", "watched": f"{found[WAYS[2]] / base:.2f}x"},
    )


if __name__ == "__main__":
    main()
