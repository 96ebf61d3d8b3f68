"""HorovodRunner, the function API: real ranks."""

from __future__ import annotations

import pytest

from hvd_magic import HorovodRunner

from .helpers import leftover_processes


def test_horovod_runner_returns_rank0_value():
    def main(base):
        import horovod.torch as hvd
        import torch

        hvd.init()
        return hvd.allreduce(torch.tensor([base + hvd.rank()]), op=hvd.Sum).item()

    assert HorovodRunner(np=-2).run(main, base=10.0) == 21.0
    assert leftover_processes() == []


def test_bad_arguments_are_value_errors_that_say_what_to_do():
    with pytest.raises(ValueError, match="np must not be 0"):
        HorovodRunner(np=0)
    with pytest.raises(ValueError, match="timeout must be positive"):
        HorovodRunner(np=-2, timeout=0)


def test_sparkdl_arguments_are_accepted():
    runner = HorovodRunner(-3, driver_log_verbosity="log_callback_only")
    assert runner.num_processor == 3
