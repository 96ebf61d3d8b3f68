"""Per-rank resources: sampled on real ranks when the notebook's beat asks, folded into the run's
record; the GPU through NVML where there is one (a fake of our interface here), none without."""

from __future__ import annotations

import pytest

from hvd_magic.protocol import Message, RankStatus
from hvd_magic.rank.telemetry import GpuSample, ResourceSampler, gpu_probe
from hvd_magic.run import supervisor
from hvd_magic.run.record import RunRecord

HOLD = """
import time, numpy as np, horovod.torch as hvd
hvd.init()
ballast = np.ones(300 * 2**20 // 8)  # 300 MB in every rank
deadline = time.time() + 3
while time.time() < deadline:   # busy: a core's worth of CPU
    pass
hvd.rank()
"""


class FakeNvml:
    def __init__(self) -> None:
        self.calls = 0

    def sample(self) -> GpuSample | None:
        self.calls += 1
        return GpuSample(utilisation=87.0, memory_used=3 * 2**30, memory_total=16 * 2**30, temperature=71.0)


def test_a_sample_has_the_process_trees_figures_and_the_gpus():
    fake = FakeNvml()
    figures = ResourceSampler(fake).sample()
    assert figures["rss"] > 10 * 2**20 and figures["cpu"] >= 0
    assert (figures["gpu"], figures["gpu_memory"], figures["gpu_temperature"]) == (87.0, 3 * 2**30, 71.0)
    assert figures["gpu_memory_total"] == 16 * 2**30 and fake.calls == 1
    assert "gpu" not in ResourceSampler(None).sample()
    assert figures["cores"] >= 1 and 0 <= figures["host_cpu"] <= 100 and figures["swapped"] >= 0


def test_without_a_gpu_there_is_no_probe():
    assert gpu_probe() is None  # nvidia-ml-py is installed here, but there is no driver or GPU


def test_the_run_record_keeps_each_ranks_resources(ip, monkeypatch):
    runs: list[supervisor.Run] = []
    real_init = supervisor.Run.__init__

    def recorded(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(supervisor.Run, "__init__", recorded)
    assert ip.run_cell_magic("horovod", "np=-2", HOLD) == 0
    record = runs[-1].record
    assert set(record.resources) == {0, 1}
    peaks = record.peak_rss()
    assert all(peak > 300 * 2**20 for peak in peaks.values()), peaks  # the ballast, seen by the beats
    busiest = {rank: peak.cpu for rank, peak in record.peaks.items()}
    assert all(cpu > 30 for cpu in busiest.values()), busiest  # busy ranks, on a loaded machine
    assert all(status.gpu == -1.0 for status in record.resources.values())


def test_the_record_keeps_a_ranks_latest_figures_and_its_peaks_not_every_beat():
    """A beat a second a rank was kept in a list: 64 ranks over 3 days, some 7 GiB."""
    record = RunRecord(1, began=0.0, last_message=0.0)
    for beat in range(10_000):
        rss = 2**30 if beat == 5_000 else 2**20 * (1 + beat % 7)
        record.apply(Message(RankStatus(rss=rss, cpu=float(beat % 90)), 0), float(beat))
    assert record.resources == {0: RankStatus(rss=2**20 * (1 + 9_999 % 7), cpu=float(9_999 % 90))}
    assert record.peak_rss() == {0: 2**30} and record.peaks[0].cpu == 89.0


@pytest.mark.parametrize("hidden", ["", " "])
def test_hidden_gpus_are_not_probed(monkeypatch, hidden):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
    assert gpu_probe() is None
