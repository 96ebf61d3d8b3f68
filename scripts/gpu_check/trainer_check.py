"""The trainers' check: a Hugging Face ``Trainer`` on NCCL on the GPU (issue 79), feeding the live
view through the callback hvd_magic adds itself. One rank: NCCL refuses two ranks on one GPU."""

from __future__ import annotations

import cells
from mode import Mode, expect, scalars, shell


def hf_trainer(mode: Mode) -> str:
    """A HF Trainer (tiny BERT) on NCCL, 32 steps; the view's steps, loss and learning rate."""
    logs = mode.work / "logs"
    cell = mode.cell(cells.HF_TRAINER, output=str(mode.work / "out"), cpu=not mode.gpu)
    backend, device, wrapped, world, steps, added = shell().run_cell_magic(
        "horovod", f"np=-1 backend=torch logdir={logs}", cell
    )
    expect(backend == mode.nccl, f"the trainer's process group is {backend}, not {mode.nccl}")
    expect(device == ("cuda:0" if mode.gpu else "cpu"), f"the model is on {device}")
    expect(wrapped == "DistributedDataParallel", f"the trainer wrapped its model in {wrapped}, not DDP")
    expect((world, steps) == (1, 32), f"world size {world}, {steps} steps (1 and 32 expected)")
    expect("HFCallback" in added, f"hvd_magic's callback was not added: {added}")
    events = scalars(logs)
    series = {
        tag: events.Scalars(tag) for tag in ("loss", "learning_rate") if tag in events.Tags()["scalars"]
    }
    expect(set(series) == {"loss", "learning_rate"}, f"the view has {sorted(events.Tags()['scalars'])}")
    last = max(event.step for event in series["learning_rate"])
    expect(last == 32, f"the view's learning rate ends at step {last}, not 32")
    return (
        f"{backend} on {device} ({wrapped}), {steps} steps; the view: {len(series['loss'])} losses, "
        f"{len(series['learning_rate'])} learning rates to step {last}"
    )
