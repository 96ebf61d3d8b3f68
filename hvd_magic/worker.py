"""Runs inside every rank: ``python -m hvd_magic.worker``.

It connects to the notebook's hub (address and keys come from the environment, which it then
scrubs), fetches the payload, sends its stdout/stderr to the hub as it is written (file
descriptor level, so C++ and child-process output is caught too), runs the cell or function,
and reports rank 0's value or the rank's traceback. It must not import IPython.
"""

from __future__ import annotations

import ast
import atexit
import faulthandler
import json
import linecache
import os
import socket
import sys
import threading
import traceback
import types
from typing import Any

import cloudpickle

from . import reporting
from .hub import HubClient
from .launch.processes import die_with_parent
from .protocol import (
    CELL_FILENAME,
    ENV_HUB,
    ENV_SHARD,
    ENV_SHARDS,
    ENV_SLOT_GPUS,
    ENV_TOKEN,
    CellPayload,
    Exit,
    FunctionPayload,
    Log,
    RankError,
    Result,
    Started,
)
from .stalls import StallFilter, WaitWatch
from .timeline.stream import TimelineStream

PAYLOAD_TIMEOUT = 120.0
_CHUNK = 65536


def rank_from_env() -> tuple[int, int, int]:
    """(rank, local_rank, size) as set by mpirun (Open MPI / PMI), Horovod's Gloo launcher or
    the torch.distributed one."""
    env = os.environ
    for rank_var, local_var, size_var in (
        ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
        ("RANK", "LOCAL_RANK", "WORLD_SIZE"),  # torch.distributed's env:// (backend=torch)
    ):
        if rank_var in env:
            return int(env[rank_var]), int(env.get(local_var, 0)), int(env.get(size_var, 1))
    return 0, 0, 1


def shard_for_local_rank(shards: str | None, local_rank: int) -> str | None:
    """This rank's data shard file (``data=``), from the per-local-rank list of its host."""
    paths = json.loads(shards) if shards else []
    return str(paths[local_rank]) if local_rank < len(paths) else None


def gpu_for_local_rank(slot_gpus: str | None, local_rank: int) -> str | None:
    """CUDA_VISIBLE_DEVICES for this rank: the GPUs Spark gave the slot of ``local_rank``."""
    if not slot_gpus:
        return None
    slots = json.loads(slot_gpus)
    if local_rank >= len(slots) or not slots[local_rank]:
        return None
    return ",".join(str(gpu) for gpu in slots[local_rank])


class _OutputForwarder:
    """Points fd 1 and 2 at pipes and forwards what arrives to the hub, chunk by chunk."""

    def __init__(self, client: HubClient) -> None:
        self.client = client
        self.original_stderr = os.dup(2)
        self.threads: list[threading.Thread] = []
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(target=self._pump, args=(read_end, stream), daemon=True)
            thread.start()
            self.threads.append(thread)
        sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")

    def _pump(self, fd: int, stream: str) -> None:
        # Horovod's stall warnings (stderr) become Stall messages instead of log text.
        stalls = StallFilter() if stream == "stderr" else None
        while chunk := os.read(fd, _CHUNK):
            if stalls is not None:
                chunk, found = stalls.feed(chunk)
                for stall in found:
                    self.client.send(stall)
            if chunk:
                self.client.send(Log(stream), chunk)
        if stalls is not None and (rest := stalls.flush()):
            self.client.send(Log(stream), rest)
        os.close(fd)

    def close(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        for thread in self.threads:
            thread.join(timeout=5)


def _run_cell(payload: CellPayload) -> tuple[Any, dict[str, Any]]:
    # The cell runs as this process's __main__, like a notebook cell in the kernel's.
    namespace = sys.modules["__main__"].__dict__
    namespace.update(payload.namespace)
    lines = payload.source.splitlines(keepends=True)
    linecache.cache[CELL_FILENAME] = (len(payload.source), None, lines, CELL_FILENAME)
    tree = ast.parse(payload.source, CELL_FILENAME)
    last: ast.expr | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop().value  # type: ignore[attr-defined]
    exec(compile(tree, CELL_FILENAME, "exec"), namespace)
    value = None
    if last is not None:
        value = eval(compile(ast.Expression(last), CELL_FILENAME, "eval"), namespace)
    if payload.silent:
        value = None
    missing = [n for n in payload.return_names if n not in namespace]
    if missing:
        raise NameError(f"return= names not defined by the cell on rank 0: {', '.join(missing)}")
    return value, {n: namespace[n] for n in payload.return_names}


def _load_payload(blob: bytes) -> CellPayload | FunctionPayload:
    try:
        payload: CellPayload | FunctionPayload = cloudpickle.loads(blob)
    except ImportError as err:
        raise ImportError(
            f"the payload needs module {err.name!r}, which this rank cannot import ({err}). Install it "
            "where the ranks run (on Spark: on every executor), or define the code in the notebook."
        ) from None
    return payload


def _user_traceback(err: BaseException) -> str:
    tb: types.TracebackType | None = err.__traceback__
    # Drop the worker's own frames: the user's story starts in their cell or function.
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb))


def _send_result(client: HubClient, value: Any, returned: dict[str, Any]) -> None:
    try:
        blob = cloudpickle.dumps((value, returned))
    except Exception as err:  # noqa: BLE001
        raise TypeError(
            f"rank 0's result (a {type(value).__name__}) cannot be pickled back to the notebook: "
            f"{err}. Return plain data (numbers, lists, dicts, arrays, state_dicts)."
        ) from None
    client.send(Result(), blob)


def _run(client: HubClient, blob: bytes, rank: int, host: str) -> int:
    """Run the payload; rank 0 sends its value. Returns the rank's exit code; an exception (or
    a non-zero sys.exit) is reported with its traceback. sys.exit(0) is a normal end."""
    try:
        payload = _load_payload(blob)
        if isinstance(payload, FunctionPayload):
            value, returned = payload.function(**payload.kwargs), dict[str, Any]()
        else:
            value, returned = _run_cell(payload)
    except SystemExit as err:
        if err.code not in (None, 0):
            _report_error(client, host, err)
            return err.code if isinstance(err.code, int) else 1
        value, returned = None, {}
    except BaseException as err:  # noqa: BLE001 - every failure is reported, then we exit
        _report_error(client, host, err)
        return 130 if isinstance(err, KeyboardInterrupt) else 1
    if rank == 0:
        try:
            _send_result(client, value, returned)
        except TypeError as err:
            _report_error(client, host, err)
            return 1
    return 0


def _report_error(client: HubClient, host: str, err: BaseException) -> None:
    sys.stderr.flush()
    client.send(RankError(host, type(err).__name__, str(err), _user_traceback(err)))


def main() -> int:
    die_with_parent()
    if os.getppid() == 1:  # the launcher is already gone
        return 1
    rank, local_rank, size = rank_from_env()
    address = os.environ.pop(ENV_HUB)
    token = os.environ.pop(ENV_TOKEN)
    # Before anything imports a framework: each rank sees only its slot's GPUs.
    gpus = gpu_for_local_rank(os.environ.pop(ENV_SLOT_GPUS, None), local_rank)
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    shard = shard_for_local_rank(os.environ.pop(ENV_SHARDS, None), local_rank)
    if shard is not None:
        os.environ[ENV_SHARD] = shard
    client = HubClient(address, token, rank)
    host = socket.gethostname()
    try:
        blob = client.fetch_payload(PAYLOAD_TIMEOUT)
    except (TimeoutError, ConnectionError) as err:
        print(f"hvd_magic worker rank {rank}: {err}", file=sys.stderr)
        client.close()
        return 3
    client.send(Started(host, os.getpid(), local_rank, size))
    forwarder = _OutputForwarder(client)
    faulthandler.enable(file=os.fdopen(forwarder.original_stderr, "w"), all_threads=True)
    reporting._attach(client)
    # torch.distributed ranks (env:// set up for them): the hub hears where a rank waits.
    watch = WaitWatch(client.send) if "MASTER_PORT" in os.environ and "RANK" in os.environ else None
    if watch is not None:
        watch.start()
    timeline = (
        TimelineStream(client, os.environ["HOROVOD_TIMELINE"]).start()
        if rank == 0 and os.environ.get("HOROVOD_TIMELINE")
        else None
    )
    code = 1
    try:
        code = _run(client, blob, rank, host)
    finally:
        if watch is not None:
            watch.stop()
        reporting._detach()
        forwarder.close()
        if timeline is not None:
            timeline.finish()
        client.send(Exit(code))
        client.close()
    return code


if __name__ == "__main__":
    exit_code = main()
    # atexit hooks finalize MPI (mpirun counts a rank that skips MPI_Finalize as failed); then
    # skip the interpreter's module teardown, where frameworks' destructors can hang a rank.
    atexit._run_exitfuncs()
    os._exit(exit_code)
