"""The trainers' callbacks, for those who add them by hand (a rank adds them itself: see
``hvd_magic.rank.trainers``; ``HVD_MAGIC_TRAINERS=0`` turns that off)::

    from hvd_magic.integrations import HFCallback, LightningCallback
    Trainer(model, args, train_dataset=data, callbacks=[HFCallback()])   # transformers
    lightning.Trainer(devices=2, callbacks=[LightningCallback()])          # Lightning

Each is a subclass of its trainer's callback class, built when first asked for (importing
hvd_magic imports no trainer). ``stoppable=False`` leaves the run's first interrupt to stop the
ranks at once, as a loop that never asks ``hvd_magic.stopping()``.
"""

from __future__ import annotations

__all__ = ["HFCallback", "LightningCallback"]  # noqa: F822 - built on first use


def __getattr__(name: str) -> object:
    if name == "HFCallback":
        from hvd_magic.rank.trainers.hf_trainer import callback_class

        return callback_class()
    if name == "LightningCallback":
        from hvd_magic.rank.trainers.lightning_trainer import callback_class as lightning_class

        return lightning_class()
    raise AttributeError(f"module 'hvd_magic.integrations' has no attribute {name!r}")
