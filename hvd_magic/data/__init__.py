"""The user's data in the ranks: ``%%horovod np=4 data=train_df``, then ``hvd_magic.shard()``.

    split    pure: rows into equal shards (which row goes to which rank, what is dropped)
    files    the Arrow IPC shard file a rank reads (memory-mapped), and how it is written
    source   notebook side: what ``data=`` accepts, local shards, the Spark keyed repartition

On Spark each barrier task writes its partition (one shard) on its executor and hands it to
the rank in its slot: rows never pass through the notebook. Locally (np < 0) the notebook
writes the shards. This package never imports a framework.
"""

from __future__ import annotations

import os
from typing import Any

from hvd_magic.errors import DataError
from hvd_magic.protocol import ENV_SHARD

__all__ = ["shard"]


def shard(form: str = "pandas") -> Any:
    """This rank's rows of the run's ``data=`` input.

    ``form``: ``"pandas"`` (a DataFrame), ``"arrow"`` (a pyarrow Table, memory-mapped: no
    copy) or ``"batches"`` (an iterator of pyarrow RecordBatches, for shards larger than
    memory). Column types arrive as Spark has them; ML vectors arrive as arrays.

    >>> part = hvd_magic.shard()                          # doctest: +SKIP
    >>> for batch in hvd_magic.shard("batches"): ...      # doctest: +SKIP
    """
    path = os.environ.get(ENV_SHARD)
    if not path:
        raise DataError(
            "hvd_magic.shard() gives a rank its rows of the run's data= input, and this process has "
            "none: run the cell with %%horovod np=N data=NAME (or HorovodRunner(np, data=df))."
        )
    from hvd_magic.data.files import read_shard

    return read_shard(path, form)
