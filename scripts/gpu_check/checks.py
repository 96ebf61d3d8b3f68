"""The checks, each a function of the mode: it returns what it saw, or raises ``Failed`` with why.
On the GPU each runs in its own process (``__main__`` starts them), so a hang or a crash costs
only itself; the CPU dry run runs them in one.
Cells run through IPython's ``%%horovod`` as in a notebook; the straggler check watches the run's
messages through the supervisor's view interface, as the suite does."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import cells
from mode import Failed, Mode, expect, scalars, shell
from trainer_check import hf_trainer


def build(mode: Mode) -> str:
    """install-horovod with NCCL and Gloo against this torch, and what doctor says of it."""
    command = [sys.executable, "-m", "hvd_magic", "install-horovod", "--without-mpi"]
    sdist, carried = Path(os.environ.get("GPU_CHECK_SDIST", "")), os.environ.get("GPU_CHECK_WHEEL")
    if carried and mode.gpu:  # built by an earlier run on such a machine: install, do not build
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", carried]
    elif not mode.gpu:
        command.append("--dry-run")  # the plan only: this machine's Horovod is the suite's
    elif sdist.is_file():
        command += ["--sdist", str(sdist)]
    if mode.gpu and "HOROVOD_BUILD_CUDA_CC_LIST" not in os.environ:  # this GPU's kernels only: faster
        import torch

        major, minor = torch.cuda.get_device_capability()
        os.environ["HOROVOD_BUILD_CUDA_CC_LIST"] = f"{major}{minor}"
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    print(done.stdout, done.stderr, sep="\n")
    expect(done.returncode == 0, f"install-horovod failed: {(done.stdout + done.stderr).strip()[-1500:]}")
    planned = "GPU operations  NCCL" in done.stdout or bool(carried)
    if not mode.gpu:
        return "the plan (dry-run): " + ("NCCL" if planned else "CPU only, as this machine has no CUDA")
    expect(planned, "install-horovod did not plan NCCL: " + done.stdout[-800:])
    doctor = subprocess.run([sys.executable, "-m", "hvd_magic", "doctor"], capture_output=True, text=True)
    print(doctor.stdout, doctor.stderr, sep="\n")
    said = next((line for line in doctor.stdout.splitlines() if "built with" in line), "")
    expect(
        "NCCL ✓" in said and "Gloo ✓" in said, f"doctor does not say NCCL and Gloo: {said or doctor.stdout}"
    )
    return f"built with NCCL and Gloo; doctor: {said.strip()}"


def horovod(mode: Mode) -> str:
    """hvd.allreduce of a CUDA tensor through NCCL; the live view's figures (as TensorBoard keeps
    them); a timeline with NCCL spans; Horovod's synchronize timed for the straggler watch."""
    from hvd_magic.timeline import read

    timeline, logs = mode.work / "timeline.json", mode.work / "logs"
    ip = shell()
    options = f"np=-1 launcher=gloo timeline={timeline} logdir={logs}"
    device, value, nccl, size, timed = ip.run_cell_magic("horovod", options, mode.cell(cells.HOROVOD))
    expect(device == ("cuda:0" if mode.gpu else "cpu") and value == 1.0 and size == 1, f"{device} {value}")
    expect(nccl == mode.gpu, f"hvd.nccl_built() is {nccl}")
    expect(timed, "Horovod's synchronize was not timed (collective_time.waited() is None)")
    events = scalars(logs)
    tags = events.Tags()["scalars"]
    expect(
        len(events.Scalars("loss")) == 30, f"the view's loss has {len(events.Scalars('loss'))} of 30 steps"
    )
    gpu_tags = [tag for tag in tags if tag.startswith("resources/gpu")]
    expect(bool(gpu_tags) == mode.gpu, f"GPU figures: {gpu_tags}")
    memory_tags = [tag for tag in gpu_tags if tag.startswith("resources/gpu_memory_mb")]
    memory = max((e.value for tag in memory_tags for e in events.Scalars(tag)), default=0.0)
    expect(memory > 0 or not mode.gpu, "NVML said the GPU holds no memory")
    names = set(read(timeline).spans()["name"])
    kind = "NCCL_" if mode.gpu else "GLOO_"
    expect(any(name.startswith(kind) for name in names), f"no {kind} span in the timeline: {sorted(names)}")
    spans = sorted(name for name in names if name.startswith(kind))
    figures = f"{len(gpu_tags)} GPU figures ({memory:.0f} MB)"
    return f"allreduce on {device}; view: 30 steps, {figures}; timeline: {spans}"


def torch_nccl(mode: Mode) -> str:
    """backend=torch with NCCL on the GPU, as a cell and through TorchDistributor's local mode."""
    import cloudpickle

    import hvd_magic

    cloudpickle.register_pickle_by_value(cells)  # the ranks have no scripts/ on their path
    ip = shell()
    backend, device, value, visible, current = ip.run_cell_magic(
        "horovod", "np=-1 backend=torch", mode.cell(cells.TORCH)
    )
    expect(
        (backend, device, value) == (mode.nccl, f"{mode.device}:0" if mode.gpu else "cpu", 2.0),
        f"{backend} {device} {value}",
    )
    expect(
        visible == os.environ.get("CUDA_VISIBLE_DEVICES"), f"CUDA_VISIBLE_DEVICES became {visible!r} locally"
    )
    expect(current == (0 if mode.gpu else -1), f"current device {current}")
    distributor = hvd_magic.TorchDistributor(num_processes=1, local_mode=True, use_gpu=mode.gpu)
    result = distributor.run(cells.distributed_function, mode.device, mode.nccl)
    expect(result[:3] == (mode.nccl, "cuda:0" if mode.gpu else "cpu", 1.0), f"TorchDistributor: {result}")
    return f"cell: {backend} on {device}; TorchDistributor(use_gpu={mode.gpu}): {result[0]} on {result[1]}"


def shared(mode: Mode) -> str:
    """Two ranks on the one GPU with Gloo on CUDA tensors: each sees the GPU the pinning says, and
    is warm: forked from a server whose imports (PyTorch, torch._dynamo) did not set up CUDA."""
    ip = shell()
    seen = ip.run_cell_magic("horovod", "np=-2 backend=torch", mode.cell(cells.SHARED))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    want = [(r, visible, 0 if mode.gpu else -1, "cuda:0" if mode.gpu else "cpu", 3.0, True) for r in (0, 1)]
    expect([tuple(s) for s in seen] == want, f"ranks saw {seen}, expected {want}")
    return f"2 ranks: {seen}"


def session(mode: Mode) -> str:
    """A live session on the GPU: built in one cell, trained in the next, status with NVML."""
    ip = shell()
    try:
        ip.run_line_magic("horovod", "start np=-1 backend=torch")
        ip.run_cell_magic("horovod", "", mode.cell(cells.SESSION_BUILD))
        device, kept, first, last = ip.run_cell_magic("horovod", "", mode.cell(cells.SESSION_TRAIN))
        expect(device == ("cuda:0" if mode.gpu else "cpu"), f"the model is on {device}")
        expect(last < first / 2, f"the second cell did not train the first cell's model: {first} -> {last}")
        expect(kept > 0 or not mode.gpu, "no CUDA memory kept between cells")
        out = io.StringIO()
        with redirect_stdout(out):
            ip.run_line_magic("horovod", "status")
        status = out.getvalue()
        print(status)
        expect("live session: 1 ranks" in status, status)
        expect(("GB" in status) == mode.gpu, f"GPU figures in %horovod status: {status}")
    finally:
        ip.run_line_magic("horovod", "stop")
    return (
        f"model on {device}, loss {first:.3f} -> {last:.4f}, {kept / 2**20:.1f} MB kept; "
        + status.splitlines()[-1].strip()
    )


def straggler(mode: Mode) -> str:
    """DDP's device-event waits on the GPU: a rank whose GPU is busy is named, then cleared."""
    from hvd_magic.options import make_options
    from hvd_magic.protocol import Straggler
    from hvd_magic.run.packing import pack_cell
    from hvd_magic.run.supervisor import run_on_ranks

    switches = mode.work
    named: list[Straggler] = []

    class Switching:  # the run's view: lets rank 1 recover once named, stops once it caught up
        def notice(self, text: str) -> None:
            print(text)

        def message(self, message: Any) -> None:
            if isinstance(message.record, Straggler):
                named.append(message.record)
                (switches / ("stop" if message.record.recovered else "recover")).touch()

        def tick(self) -> None:
            pass

        def close(self) -> None:
            pass

    size, repeat = (8192, 12) if mode.gpu else (384, 40)
    cell = mode.cell(cells.STRAGGLER, size=size, repeat=repeat, folder=str(switches))
    # the timing's own limit is the timing check's: here a busy host's slower hooks must not stop it
    options = make_options(np=-2, backend="torch", stragglers="0.5/2", env={"HVD_MAGIC_TIMING_LIMIT": "off"})
    (steps, timed, device), _ = run_on_ranks(pack_cell(cell, {}), options, Switching())
    said = [(s.slow_rank, s.recovered) for s in named]
    expect(said == [(1, False), (1, True)], f"stragglers said: {named}")
    expect(timed and device == mode.device, f"DDP's waits timed: {timed}, model on {device}")
    return f"rank 1 named ({named[0].reason}), then cleared, after {steps} steps on {device}"


def retry(mode: Mode) -> str:
    """A CUDA model checkpointed, its rank killed, resumed by retries=1 as if never killed."""
    import torch

    marks, store = mode.work / "marks", mode.work / "store"
    marks.mkdir()
    ip = shell()
    cell = mode.cell(cells.RETRY, marks=str(marks))
    device, weight = ip.run_cell_magic(
        "horovod", f"np=-1 backend=torch retries=1 checkpoint_dir={store}", cell
    )
    expect((marks / "killed").exists() and (marks / "resumed-10").exists(), f"marks: {os.listdir(marks)}")
    torch.manual_seed(0)  # the same training, never killed, here
    model = torch.nn.Linear(16, 1).to(mode.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        optimizer.zero_grad()
        model(torch.ones(4, 16, device=mode.device)).pow(2).mean().backward()
        optimizer.step()
    reference = float(model.weight.sum())
    expect(abs(weight - reference) <= 1e-5 * max(1.0, abs(reference)), f"{weight} != {reference}")
    return f"killed at step 13, resumed from step 10 on {device}; weights as never killed"


def timing(mode: Mode) -> str:
    """What timing the waits adds to a step (issue 41, ``bench/stragglers.py``): DDP's CUDA-event
    hook and Horovod-torch's timed synchronize, each beside an untimed copy in the same rank; on
    the GPU, within 1 % of the 1-rank step (one GPU cannot hold two NCCL ranks), or, DDP's, a
    timing that limits itself: left to its limit, it is off and says so once (issue 77)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import stragglers

    said, over = [], []
    for path in ("ddp", "horovod"):  # both measured, whichever fails
        steps = 2000 if mode.gpu else 20  # on the CPU nothing is measured: the path is run
        timed, off = stragglers.seconds(path, steps, device=mode.device)
        share = 100 * (timed - off) / off
        said.append(f"{path}: {1e6 * (timed - off):+.0f} us = {share:+.2f} % of a {1e3 * off:.2f} ms step")
        limited = path == "ddp" and (share > 1.0 or not mode.gpu)  # on the CPU: the path is run
        stopped, lines = (
            stragglers.limits_itself(mode.device, 400 if mode.gpu else 240) if limited else (False, [])
        )
        if limited:
            said.append(f"left to its limit: {'off, said ' + repr(lines) if stopped else 'on'}")
        over += [path] if share > 1.0 and not (stopped and len(lines) == 1) else []
    figures = f"on {mode.device}: " + "; ".join(said)
    expect(not over or not mode.gpu, f"timing the waits costs more than 1 % ({', '.join(over)}): {figures}")
    return figures


# In this order: what needs no Horovod first, so that a build that fails or overruns the budget
# leaves the rest proved; Horovod's own check after its build.
CHECKS: dict[str, Callable[[Mode], str]] = {
    "torch_nccl": torch_nccl,
    "shared_gpu": shared,
    "session": session,
    "straggler": straggler,
    "retry": retry,
    "build": build,
    "horovod": horovod,
    "timing": timing,
    "hf_trainer": hf_trainer,
}
# The carried groups (carry.GROUPS) a check needs beyond IPython's; a check that needs the build's
# runs after it, in the same carry.
NEEDS = {"build": ("build",), "horovod": ("build",), "timing": ("build",), "hf_trainer": ("trainers",)}
# Checks whose needs do not fit one carry (carry.LIMIT_BYTES) with the others': run apart, by --only.
APART = ("hf_trainer",)


def run_one(name: str, gpu: bool) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix=f"gpu_check-{name}-") as work:
        try:
            return True, CHECKS[name](Mode(gpu, Path(work)))
        except Failed as failed:
            return False, str(failed)
        except Exception as err:  # noqa: BLE001 - any error is the check's failure, in one line
            return False, f"{type(err).__name__}: {str(err).strip()[-1500:]}"
