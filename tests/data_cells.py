"""The cell the data tests run on the ranks: each rank reads its shard in the three forms and
says which executor JVM (if any) it and the shard's writer run under."""

from __future__ import annotations

SHARD_CELL = """
import json, os, psutil, horovod.torch as hvd, hvd_magic, pyarrow as pa
hvd.init()

def executor_of(pid):
    for process in psutil.Process(pid).parents():
        if "CoarseGrainedExecutorBackend" in " ".join(process.cmdline()):
            return process.pid
    return None

frame = hvd_magic.shard()
table = hvd_magic.shard("arrow")
streamed = pa.Table.from_batches(list(hvd_magic.shard("batches")))
executor = executor_of(os.getpid())
meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
me = {
    "rank": hvd.rank(),
    "ids": frame["id"].tolist(),
    "same": table.column("id").to_pylist() == frame["id"].tolist() == streamed.column("id").to_pylist(),
    "types": {field.name: str(field.type) for field in table.schema},
    "meta": meta,
    "executor": executor,
    "writer_executor": executor_of(int(meta["hvd_magic.pid"])),
    "shard_file": os.environ["HVD_MAGIC_SHARD"],
    "executor_dirs": executor and psutil.Process(executor).environ().get("SPARK_EXECUTOR_DIRS"),
}
[json.loads(s) for s in hvd.allgather_object(json.dumps(me))]
"""


def all_ids(ranks: list[dict]) -> list[int]:
    return sorted(i for rank in ranks for i in rank["ids"])
