"""``TorchEstimator`` / ``TorchModel``: horovod.spark's PyTorch estimator, on today's stack.

>>> est = TorchEstimator(num_proc=2, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
...                      loss=torch.nn.functional.cross_entropy, feature_cols=["features"],
...                      label_cols=["label"], batch_size=64, epochs=3, validation=0.1)  # doctest: +SKIP
>>> model = est.fit(train_df)                    # doctest: +SKIP
>>> model.transform(test_df)                     # doctest: +SKIP
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable
from typing import Any

import cloudpickle

from ..errors import CaptureError
from .estimator import HorovodEstimator, HorovodModel
from .training import TrainSpec

__all__ = ["TorchEstimator", "TorchModel"]


class TorchModel(HorovodModel):
    """A fitted PyTorch model (``model.module``); transforms on the executors."""

    def __init__(self, history: list[dict[str, float]] | None = None, feature_width: int = 0) -> None:
        super().__init__(history, feature_width)
        self.module: Any = None

    def getModel(self) -> Any:  # noqa: N802 - horovod.spark's name
        """The fitted ``torch.nn.Module`` (as horovod.spark's ``TorchModel.getModel()``)."""
        return self.module

    def make_predict_fn(self) -> Callable[[], Callable[[Any], Any]]:
        from .torch_training import make_predictor

        return functools.partial(make_predictor, cloudpickle.dumps(self.module))

    def save_artifacts(self, folder: str) -> None:
        import torch

        torch.save(self.module.state_dict(), os.path.join(folder, "state_dict.pt"))
        with open(os.path.join(folder, "module.pkl"), "wb") as out:
            cloudpickle.dump(self.module, out)  # loads where the module's class is not importable

    def load_artifacts(self, folder: str) -> None:
        with open(os.path.join(folder, "module.pkl"), "rb") as blob:
            self.module = cloudpickle.load(blob)


class TorchEstimator(HorovodEstimator):
    """Trains a ``torch.nn.Module`` with Horovod on ``num_proc`` ranks: ``fit(df)`` gives a
    ``TorchModel``. Parameters as in horovod.spark (``model``, ``optimizer``, ``loss``,
    ``metrics``, ``feature_cols``, ``label_cols``, ``batch_size``, ``epochs``, ``validation``,
    ``model_dir``, ...). The optimizer's class and settings are rebuilt on every rank."""

    def train_function(self) -> Callable[[TrainSpec], Any]:
        from .torch_training import train

        return train

    def train_spec(self, checkpoint: bytes | None) -> TrainSpec:
        self.require("model", "optimizer", "loss")
        if self.getOrDefault("callbacks"):
            raise ValueError(
                "TorchEstimator takes no callbacks (they are Keras callbacks, for KerasEstimator; "
                "horovod.spark's TorchEstimator has none either). Per-epoch metrics reach the live "
                "view and model.history without them; for your own loop, subclass HorovodEstimator."
            )
        spec = self.common_spec(
            self.getOrDefault("model"), self.getOrDefault("optimizer"), self.getOrDefault("loss"), checkpoint
        )
        try:
            cloudpickle.dumps(spec.model)
        except Exception as err:  # noqa: BLE001 - whatever the model holds that cannot travel
            raise CaptureError(
                f"the model ({type(spec.model).__qualname__}) cannot be pickled to the ranks: "
                f"{type(err).__name__}: {err}. Keep locks, files and sessions out of the module."
            ) from None
        return spec

    def make_model(self, result: Any, feature_width: int) -> HorovodModel:
        import copy

        import torch

        model = TorchModel(result["history"], feature_width)
        model.module = copy.deepcopy(self.getOrDefault("model"))
        model.module.load_state_dict(torch.load(io.BytesIO(result["state"]), weights_only=False))
        return model
