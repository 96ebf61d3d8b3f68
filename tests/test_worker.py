"""Pure parts of the worker (the rest runs in every end-to-end test)."""

from __future__ import annotations

from hvd_magic.rank.worker import gpu_for_local_rank, shard_for_local_rank


def test_gpu_for_local_rank():
    assert gpu_for_local_rank('[["0"], ["1"]]', 1) == "1"
    assert gpu_for_local_rank('[["0", "1"], ["2", "3"]]', 1) == "2,3"
    assert gpu_for_local_rank(None, 0) is None
    assert gpu_for_local_rank("[[]]", 0) is None
    # torch.distributed ranks pick cuda:LOCAL_RANK: all the host's slots, in local-rank order
    assert gpu_for_local_rank('[["3"], ["5"]]', 1, by_local_rank=True) == "3,5"
    assert gpu_for_local_rank('[["0", "1"], ["2", "3"]]', 1, by_local_rank=True) == "2,3"  # not one each
    # two tasks sharing GPU 0 (gpu.amount=0.5): "0,0" hid every device from CUDA
    assert gpu_for_local_rank('[["0"], ["0"]]', 1, by_local_rank=True) == "0"
    assert gpu_for_local_rank('[["0"], ["0"]]', 0) == "0"


def test_shard_for_local_rank():
    assert shard_for_local_rank('["/tmp/a", "/tmp/b"]', 1) == "/tmp/b"
    assert shard_for_local_rank(None, 0) is None
    assert shard_for_local_rank("[]", 0) is None
