"""Per-rank resources, sampled on the rank when the notebook's beat asks (about once a second):
its process tree's CPU % and RSS, its host's CPU and swapping (what tells a rank starved by its
host), and where a GPU is present, its device's utilisation, memory and temperature. NVML
(``nvidia-ml-py``) is imported only when installed, and a machine without a GPU or a driver
simply has none to report; ``GpuProbe`` is the interface (tests give a fake).

A sample costs a few system calls (psutil's process tree, one NVML query): nothing a step of
training notices (``bench/telemetry.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

__all__ = ["GpuProbe", "GpuSample", "NvmlProbe", "ResourceSampler", "gpu_probe"]

TREE_EVERY = 5  # samples between two scans for the rank's child processes


@dataclass(frozen=True)
class GpuSample:
    utilisation: float  # percent
    memory_used: int  # bytes
    memory_total: int
    temperature: float  # degrees Celsius


class GpuProbe(Protocol):
    def sample(self) -> GpuSample | None: ...


class NvmlProbe:
    """The rank's GPU (the first it sees) through NVML."""

    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def sample(self) -> GpuSample | None:
        try:
            rates = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
            memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
            temperature = self.nvml.nvmlDeviceGetTemperature(self.handle, self.nvml.NVML_TEMPERATURE_GPU)
        except self.nvml.NVMLError:
            return None
        return GpuSample(float(rates.gpu), int(memory.used), int(memory.total), float(temperature))


def gpu_probe() -> GpuProbe | None:
    """NVML's view of this rank's GPU; None without nvidia-ml-py, a driver, or a GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return None  # GPUs hidden from this rank
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        first = (visible or "0").split(",")[0].strip()
        index = int(first) if first.isdigit() else 0  # a UUID: NVML's first device
        return NvmlProbe(pynvml, index)
    except pynvml.NVMLError:
        return None


class ResourceSampler:
    """What a rank reports of itself: CPU % (of one core, since the last sample) and RSS of
    its process tree, and its GPU's figures when it has one."""

    def __init__(self, gpu: GpuProbe | None = None, process: psutil.Process | None = None) -> None:
        self.process = process or psutil.Process()
        self.gpu = gpu
        self._children: dict[int, psutil.Process] = {}
        self._samples = 0
        self.cores = _cores()
        self.process.cpu_percent()
        psutil.cpu_percent()

    def sample(self) -> dict[str, float]:
        tree = [self.process, *self._tree()]
        cpu = rss = 0.0
        for process in tree:
            try:
                cpu += process.cpu_percent()
                rss += process.memory_info().rss
            except psutil.Error:
                continue
        figures = {"cpu": cpu, "rss": rss, **self._host()}
        sample = self.gpu.sample() if self.gpu is not None else None
        if sample is not None:
            figures |= {
                "gpu": sample.utilisation,
                "gpu_memory": float(sample.memory_used),
                "gpu_memory_total": float(sample.memory_total),
                "gpu_temperature": sample.temperature,
            }
        return figures

    def _host(self) -> dict[str, float]:
        """What tells a rank starved by its host from one slow of its own: the host's CPUs
        (busy since the last sample), the cores the rank may use, the host's swapping."""
        swap = psutil.swap_memory()
        return {
            "host_cpu": psutil.cpu_percent(),
            "cores": float(self.cores),
            "swapped": float(swap.sin + swap.sout),
        }

    def _tree(self) -> list[psutil.Process]:
        """The children, the same Process objects from sample to sample (psutil's CPU % is
        measured between two calls on one object). Finding them scans every process of the
        machine, so the list is renewed every ``TREE_EVERY`` samples, not at each."""
        self._samples += 1
        if self._samples % TREE_EVERY != 1:
            return list(self._children.values())
        try:
            current = {child.pid: child for child in self.process.children(recursive=True)}
        except psutil.Error:
            return []
        self._children = {pid: self._children.get(pid, child) for pid, child in current.items()}
        return list(self._children.values())


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
