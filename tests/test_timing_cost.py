"""What timing a rank's waits costs, and the limit on it (``rank.timing_cost``): the probe's
verdicts on a fake clock, the figure held while it runs, and for real, two DDP ranks whose
timing's events cost a controlled time (over the limit: off, said once) or whose timing is
cheap (kept)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hvd_magic.options import OptionError, make_options
from hvd_magic.protocol import Message, Reports, TimingOff
from hvd_magic.protocol.env import parse_timing_limit
from hvd_magic.rank.timing_cost import (
    LONG_STEP,
    MIN_BLOCKS,
    PROBE_SECONDS,
    PROBE_STEPS,
    WARM_UP_STEPS,
    CostProbe,
)
from hvd_magic.run.packing import pack_cell
from hvd_magic.run.supervisor import run_on_ranks
from hvd_magic.run.views import ConsoleView

CHECKOUT = str(Path(__file__).resolve().parents[1])  # the ranks import this file's Slow


def probed(
    step: Callable[[int, bool], float], limit: float = 0.01, steps: int = 400
) -> tuple[CostProbe, list[bool]]:
    """A probe fed ``steps`` training steps on a fake clock, step ``i`` taking ``step(i, timed)``
    seconds; the probe and what it said of each step."""
    probe, now, said = CostProbe(limit), 1000.0, []
    for i in range(steps):
        timed = probe.step(now)
        said.append(timed)
        now += step(i, timed)
    return probe, said


def test_a_timing_that_costs_a_tenth_of_the_step_is_over_the_limit():
    probe, said = probed(lambda i, timed: 0.0011 if timed else 0.001)
    assert all(said[:WARM_UP_STEPS])  # the warm-up is timed
    window = said[WARM_UP_STEPS : WARM_UP_STEPS + PROBE_STEPS]
    assert window[:8] == [True, False, False, True] * 2 and sum(window) == PROBE_STEPS // 2
    assert all(said[WARM_UP_STEPS + PROBE_STEPS :]) and probe.done and probe.over
    assert probe.cost is not None and probe.cost.share == pytest.approx(0.1)
    assert probe.cost.step == pytest.approx(0.001)


def test_a_cheap_timing_and_a_noisy_one_are_kept():
    probe, _ = probed(lambda i, timed: 0.001005 if timed else 0.001)  # 0.5 %
    assert probe.done and not probe.over and probe.cost is not None
    # 2 % on average, but the steps vary by 20 %: not clearly over, kept
    noise = random.Random(0)
    probe, _ = probed(lambda i, timed: (0.00102 if timed else 0.001) * noise.uniform(0.8, 1.2))
    assert probe.done and not probe.over and probe.cost is not None and probe.cost.blocks == PROBE_STEPS // 4


@pytest.mark.parametrize(("cost", "over"), [(0.000005, False), (0.0005, True)])  # 0.5 %, 50 %
def test_steps_another_process_slowed_decide_nothing(cost, over):
    """A busy machine (two ranks on two cores) makes some steps several times longer, whichever
    kind they are: a cheap timing is kept, a costly one still found."""
    slowed = random.Random(1)
    probe, _ = probed(lambda i, timed: (0.001 + cost * timed) * (5 if slowed.random() < 0.3 else 1))
    assert probe.done and probe.over is over, probe.cost


def test_long_steps_are_not_probed():
    probe, said = probed(lambda i, timed: LONG_STEP * 1.5, steps=WARM_UP_STEPS + 5)
    assert all(said) and probe.done and probe.cost is None and not probe.over


def test_a_probe_ends_after_its_seconds_and_judges_only_with_enough_steps():
    per_step = 0.6 * LONG_STEP  # too slow to probe PROBE_STEPS steps within PROBE_SECONDS
    probe, said = probed(lambda i, timed: per_step * (1.5 if timed else 1.0))
    assert probe.done and probe.over and said.count(False) < PROBE_STEPS // 2
    # a model that stops training mid-probe: when it comes back the probe ends, with too few steps
    probe, said = probed(lambda i, timed: PROBE_SECONDS * 2 if i == WARM_UP_STEPS + 5 else 0.001)
    assert probe.done and probe.cost is None and not probe.over and said.count(False) < 2 * MIN_BLOCKS


@pytest.mark.parametrize(
    ("spelled", "limit"), [(None, 0.01), ("", 0.01), ("2%", 0.02), ("0.05", 0.05), ("off", None), ("0", None)]
)
def test_the_limit_is_a_share_of_the_step_or_off(spelled, limit):
    assert parse_timing_limit(spelled) == limit


@pytest.mark.parametrize("bad", ["150%", "fast", "1", "-1%"])
def test_a_misspelled_limit_is_a_clear_option_error(bad):
    with pytest.raises(OptionError, match=r"HVD_MAGIC_TIMING_LIMIT=.*e\.g\. 1% or 0\.01, or off"):
        make_options(np=-2, env={"HVD_MAGIC_TIMING_LIMIT": bad})


HELD = """from hvd_magic.rank import collective_time
collective_time.measured()
collective_time.add(1.0)
said = [collective_time.waited()]
collective_time.hold("probe", 60)
collective_time.add(5.0)  # waited while held: left out
said.append(collective_time.waited())
collective_time.end_hold("probe")
said.append(collective_time.waited())
collective_time.add(2.0)
said.append(collective_time.waited())
collective_time.hold("gone quiet", 0.0)  # its holder never released it: it lapses
said.append(collective_time.waited())
print(said)
"""


def test_a_held_figure_says_none_then_goes_on_from_where_it_was():
    done = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[1.0, None, 1.0, 3.0, 3.0]", done.stderr[-2000:]


SPIN = 0.002  # seconds a Slow event's record takes: some times the cell's step


class Slow:
    """A device event whose record costs the host ``SPIN`` seconds (on an H200 a CUDA event
    recorded in a step cost it 40-60 us, 4 % of the step); the device passes it at once."""

    records = 0

    def record(self, stream: object = None) -> None:
        Slow.records += 1
        self.at = time.perf_counter()
        while time.perf_counter() - self.at < SPIN:  # the host busy for a known time, no sleep
            pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Slow) -> float:
        return (end.at - self.at) * 1000.0


COSTLY = """import torch, torch.distributed as dist, hvd_magic
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_ddp, collective_time
from hvd_magic.rank.device_waits import DeviceWaits
from tests.test_timing_cost import Slow
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(64, 1))
collective_ddp.time_on_device(model, DeviceWaits(Slow))
x, figures, records = torch.randn(8, 64), [], []
for step in range(1, 301):
    model(x).sum().backward()
    hvd_magic.report(step=step)
    figures.append(collective_time.waited())
    records.append(Slow.records)
(figures, records)
"""


class SeenView(ConsoleView):
    """The console view, keeping the messages it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[Message] = []

    def message(self, message: Message) -> None:
        self.messages.append(message)
        super().message(message)

    def waits_sent(self, rank: int) -> list[bool]:
        """Whether each step report of ``rank`` carried its waits."""
        reports = [m for m in self.messages if isinstance(m.record, Reports) and m.rank == rank]
        return ["w" in record for m in reports for record in json.loads(m.blob) if "step" in record]


def test_a_timing_that_costs_over_one_percent_of_the_step_stops_and_says_so_once(capsys):
    """Each timed step records two events of 2 ms on a step of about 1 ms: after the warm-up the
    probe finds the cost, both ranks stop timing (their figure gone, no event recorded again),
    and the view says so in one line, whichever rank said it first."""
    view = SeenView()
    options = make_options(np=-2, backend="torch", env={"PYTHONPATH": CHECKOUT})
    (figures, records), _ = run_on_ranks(pack_cell(COSTLY, {}), options, view)
    assert all(figure is not None for figure in figures[:WARM_UP_STEPS])  # timed, as before
    assert all(figure is None for figure in figures[WARM_UP_STEPS:])  # probed (held), then off
    end = WARM_UP_STEPS + PROBE_STEPS  # the probe's last step
    assert records[-1] == records[end] == 2 * (WARM_UP_STEPS + PROBE_STEPS // 2)  # none after
    offs = [m for m in view.messages if isinstance(m.record, TimingOff)]
    assert sorted(m.rank for m in offs) == [0, 1] and all(m.record.share > 0.5 for m in offs)
    lines = [line for line in capsys.readouterr().err.splitlines() if "wait timing" in line]
    assert len(lines) == 1, lines
    said = r"hvd_magic: rank [01]'s wait timing cost \d+\.\d % of its \d\.\d\d ms step \(over 1 %\); "
    assert re.fullmatch(said + "it is off for this run, and stragglers are judged by wall time", lines[0])
    for rank in (0, 1):
        sent = view.waits_sent(rank)
        assert len(sent) == 300 and sent[0] and not any(sent[end:])


CHEAP = """import time, torch, torch.distributed as dist, hvd_magic
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic.rank import collective_time
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(64, 1))  # timed on the host's clock from its first training forward
x, figures = torch.randn(8, 64), []
for step in range(1, 261):
    time.sleep(0.01)  # the step's own work (its input): the timing is a small part of the step
    model(x).sum().backward()
    hvd_magic.report(step=step)
    figures.append(collective_time.waited())
figures
"""


def test_a_cheap_timing_is_kept_after_its_probe_and_its_figure_goes_on():
    view = SeenView()
    figures, _ = run_on_ranks(pack_cell(CHEAP, {}), make_options(np=-2, backend="torch"), view)
    assert all(figure is not None for figure in figures[:WARM_UP_STEPS])
    assert figures[WARM_UP_STEPS] is None  # held while the probe runs
    resumed = next(i for i in range(WARM_UP_STEPS, len(figures)) if figures[i] is not None)
    assert resumed <= WARM_UP_STEPS + PROBE_STEPS + 1
    kept = figures[resumed:]
    assert None not in kept and kept[0] == figures[WARM_UP_STEPS - 1]  # on from where it was
    assert kept == sorted(kept)
    assert not [m for m in view.messages if isinstance(m.record, TimingOff)]
