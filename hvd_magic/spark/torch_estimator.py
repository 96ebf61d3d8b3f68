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
from pyspark.ml.param import Param, Params

from hvd_magic.errors import CaptureError
from hvd_magic.spark.columns import input_shapes_of
from hvd_magic.spark.compat_params import UNUSED
from hvd_magic.spark.estimator import HorovodEstimator, HorovodModel
from hvd_magic.spark.params import accessors
from hvd_magic.spark.training import TrainSpec

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
        from hvd_magic.spark.torch_training import make_predictor

        shapes = input_shapes_of(self.getOrDefault("input_shapes"))
        return functools.partial(make_predictor, cloudpickle.dumps(self.module), shapes)

    def save_artifacts(self, folder: str) -> None:
        import torch

        torch.save(self.module.state_dict(), os.path.join(folder, "state_dict.pt"))
        with open(os.path.join(folder, "module.pkl"), "wb") as out:
            cloudpickle.dump(self.module, out)  # loads where the module's class is not importable

    def load_artifacts(self, folder: str) -> None:
        with open(os.path.join(folder, "module.pkl"), "rb") as blob:
            self.module = cloudpickle.load(blob)


@accessors
class TorchEstimator(HorovodEstimator):
    """Trains a ``torch.nn.Module`` with Horovod on ``num_proc`` ranks: ``fit(df)`` gives a
    ``TorchModel``. Parameters as in horovod.spark (``model``, ``optimizer``, ``loss`` or
    ``loss_constructors``, ``metrics``, ``feature_cols``, ``input_shapes``, ``label_cols``,
    ``batch_size``, ``epochs``, ``validation``, ``backward_passes_per_step``,
    ``train_minibatch_fn``, ``store`` or ``model_dir``, ...). The optimizer's class and settings
    are rebuilt on every rank."""

    loss_constructors: Param[Any] = Param(
        Params._dummy(), "loss_constructors", "functions that make the loss on each rank (instead of loss=)"
    )
    train_minibatch_fn: Param[Any] = Param(
        Params._dummy(),
        "train_minibatch_fn",
        "trains one batch, with horovod.spark's signature (model, optimizer, transform_outputs, loss_fn, "
        "inputs, labels, sample_weights, backward_passes_per_step, batch_idx) -> (outputs, loss)",
    )
    framework = "pytorch"
    unused_here = UNUSED | {
        "callbacks": ([], "TorchEstimator calls no callbacks (horovod.spark's did not either)"),
    }

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self._setDefault(loss_constructors=None, train_minibatch_fn=None)
        self.setParams(**params)

    def train_function(self) -> Callable[[TrainSpec], Any]:
        from hvd_magic.spark.torch_training import train

        return train

    def train_spec(self) -> TrainSpec:
        self.require("model", "optimizer")
        constructors = self.getOrDefault("loss_constructors")
        if bool(constructors) == self.isDefined("loss"):
            raise ValueError("TorchEstimator needs one of loss= and loss_constructors= (as horovod.spark)")
        if constructors is not None and len(constructors) != 1:
            raise ValueError("TorchEstimator trains one output: give one function in loss_constructors=")
        if self.getOrDefault("backward_passes_per_step") < 1:
            raise ValueError("TorchEstimator: backward_passes_per_step must be 1 or more (batches a step)")
        loss = self.getOrDefault("loss") if self.isDefined("loss") else None
        spec = self.common_spec(self.getOrDefault("model"), self.getOrDefault("optimizer"), loss)
        spec.input_shapes = input_shapes_of(self.getOrDefault("input_shapes"))
        spec.extra = {
            "loss_constructors": constructors,
            "train_minibatch_fn": self.getOrDefault("train_minibatch_fn"),
        }
        try:
            cloudpickle.dumps(spec)
        except Exception as err:  # noqa: BLE001 - whatever the model holds that cannot travel
            raise CaptureError(
                f"the model ({type(spec.model).__qualname__}) or a function given cannot be pickled to the "
                f"ranks: {type(err).__name__}: {err}. Keep locks, files and sessions out of the module."
            ) from None
        return spec

    def make_model(self, result: Any, feature_width: int) -> HorovodModel:
        import copy

        import torch

        model = TorchModel(result["history"], feature_width)
        model.module = copy.deepcopy(self.getOrDefault("model"))
        model.module.load_state_dict(torch.load(io.BytesIO(result["state"]), weights_only=False))
        return model
