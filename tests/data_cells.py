"""The cell the data tests run on the ranks: each rank reads its shard in the three forms and
says which executor JVM (if any) it and the shard's writer run under. No framework: each rank
writes its answer to a file of its own, which the test reads after the run."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from .helpers import RANK_FROM_ENV

_SHARD_CELL = (
    """
import json, os, pathlib, psutil, hvd_magic, pyarrow as pa

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
"""
    + RANK_FROM_ENV
    + """me = {
    "rank": rank,
    "size": size,
    "ids": frame["id"].tolist(),
    "same": table.column("id").to_pylist() == frame["id"].tolist() == streamed.column("id").to_pylist(),
    "types": {field.name: str(field.type) for field in table.schema},
    "meta": meta,
    "executor": executor,
    "writer_executor": executor_of(int(meta["hvd_magic.pid"])),
    "shard_file": os.environ["HVD_MAGIC_SHARD"],
    "executor_dirs": executor and psutil.Process(executor).environ().get("SPARK_EXECUTOR_DIRS"),
}
"""
)


def writes_answer(directory: Path, answer: str) -> str:
    """A cell's last line, by which each rank writes ``answer`` (an expression: a dict with the
    rank's ``rank`` and ``size``) to ``directory``/rank-RANK.json; it needs json and pathlib."""
    return f"_ = pathlib.Path({str(directory)!r}, f'rank-{{rank}}.json').write_text(json.dumps({answer}))\n"


def answers_cell(directory: Path, answer: str) -> str:
    """A cell's end by which each rank writes ``answer`` (an expression) to ``directory``, with
    its rank and size (read back with ``rank_answers``); the cell imports json, os and pathlib."""
    return RANK_FROM_ENV + writes_answer(directory, f"{{'rank': rank, 'size': size, 'answer': {answer}}}")


def shard_cell(directory: Path) -> str:
    """The cell: each rank writes its answer to ``directory``/rank-RANK.json."""
    return _SHARD_CELL + writes_answer(directory, "me")


def rank_answers(directory: Path) -> list[dict[str, Any]]:
    """Every rank's answer, in rank order: one from each of the run's ranks."""
    answers = [json.loads(path.read_text()) for path in directory.glob("rank-*.json")]
    answers.sort(key=lambda answer: answer["rank"])
    assert answers and [a["rank"] for a in answers] == list(range(answers[0]["size"])), answers
    assert all(a["size"] == len(answers) for a in answers), answers
    return answers


def run_shard_cell(ip: Any, line: str, tmp_path: Path) -> list[dict[str, Any]]:
    """``%%horovod line`` on the shard cell; every rank's answer, in rank order (from a folder of
    the run's own below ``tmp_path``: a test may run it more than once)."""
    directory = Path(tempfile.mkdtemp(prefix="shards-", dir=tmp_path))
    ip.run_cell_magic("horovod", line, shard_cell(directory))
    return rank_answers(directory)


def all_ids(ranks: list[dict]) -> list[int]:
    return sorted(i for rank in ranks for i in rank["ids"])
