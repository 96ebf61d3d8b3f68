"""In-memory stand-ins for the hub and a launcher, to drive the engine without processes (the
real ones are tested end to end elsewhere)."""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field

import cloudpickle

from hvd_magic.hub import RunKeys
from hvd_magic.launch import Launcher, RankDeath
from hvd_magic.protocol import Exit, Message, Record, Result, Started


class LaterQueue(queue.Queue[Message]):
    """A queue of rank messages where some arrive only after so many reads: a message still on
    its way while the run looks at what came."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.later: list[tuple[int, Message]] = []

    def get(self, block: bool = True, timeout: float | None = None) -> Message:
        self.reads += 1
        for due in [item for item in self.later if item[0] <= self.reads]:
            self.later.remove(due)
            self.put(due[1])
        return super().get(block, timeout)


class FakeHub:
    """What a run's supervision uses of a Hub: a queue of rank messages, an address, keys, close()."""

    def __init__(self) -> None:
        self.events = LaterQueue()
        self.address = "inproc://fake-hub"
        self.keys = RunKeys.generate()
        self.closed = False
        self.taps: dict[type, object] = {}
        self.replies: dict[type, object] = {}  # hub.Replies.of keeps each answer type's here
        self.told: list[Record] = []
        self.inboxes: dict[int, bytes] = {}  # no rank introduced itself: none is asked anything

    def send_to(self, identity: bytes, record: Record, blob: bytes = b"") -> None:
        self.told.append(record)

    def tell_all(self, record: Record) -> None:
        self.told.append(record)

    def put(self, rank: int, record: Record, blob: bytes = b"") -> None:
        self.events.put(Message(record, rank, blob))

    def put_after(self, reads: int, rank: int, record: Record) -> None:
        """A message that arrives once the run has read the queue ``reads`` times."""
        self.events.later.append((reads, Message(record, rank)))

    def close(self) -> None:
        self.closed = True


Step = Callable[[FakeHub], None]


@dataclass
class ScriptedLauncher(Launcher):
    """Plays ``on_start`` when started; each poll plays the next of ``on_poll`` and says the
    job is still running until those are used up, then ends with ``code``."""

    on_start: list[Step] = field(default_factory=list)
    on_poll: list[Step] = field(default_factory=list)
    code: int | None = 0  # None: the job never ends by itself
    seen_deaths: list[RankDeath] = field(default_factory=list)
    output: str = ""
    env: dict[str, str] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)  # what stop() says it could not stop
    on_stop: list[Step] = field(default_factory=list)  # messages the stop makes the ranks send
    stops: int = 0

    def start(self, hub, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
        self.hub, self.env = hub, env
        for step in self.on_start:
            step(hub)

    def poll(self) -> int | None:
        if self.on_poll:
            self.on_poll.pop(0)(self.hub)
            return None
        return self.code

    def stop(self) -> list[str]:
        self.stops += 1
        for step in self.on_stop:
            step(self.hub)
        return list(self.leftovers)

    def diagnostics(self) -> str:
        return self.output

    def deaths(self) -> list[RankDeath]:
        return list(self.seen_deaths)


def send(rank: int, record: Record, blob: bytes = b"") -> Step:
    return lambda hub: hub.put(rank, record, blob)


def nothing(hub: FakeHub) -> None:
    pass


def healthy_rank(rank: int, value: object = None) -> list[Step]:
    """A rank that starts, (rank 0) returns ``value``, and exits 0."""
    steps = [send(rank, Started(f"host-{rank}", 100 + rank, rank, 2))]
    if rank == 0:
        steps.append(send(0, Result(), cloudpickle.dumps((value, {}))))
    return [*steps, send(rank, Exit(0))]


class SteppingClock:
    """A clock that moves ``step`` seconds each time it is read: time limits pass in no time."""

    def __init__(self, step: float = 1.0) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now
