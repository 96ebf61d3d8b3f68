"""Runs inside every rank: ``python -m hvd_magic.rank.worker``.

It connects to the notebook's hub (address and keys come from the environment, which it then
scrubs), fetches the payload, sends its stdout/stderr to the hub as it is written (file
descriptor level, so C++ and child-process output is caught too), runs the cell or function,
and reports rank 0's value or the rank's traceback. It must not import IPython.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from hvd_magic.protocol import (
    ENV_HUB,
    ENV_SHARD,
    ENV_SHARDS,
    ENV_SLOT_GPUS,
    ENV_TIME_WAITS,
    ENV_TOKEN,
    Exit,
    SessionPayload,
    Started,
)
from hvd_magic.protocol.env import TIMELINE_DYNAMIC, rank_from_env
from hvd_magic.protocol.lifetime import die_with_parent
from hvd_magic.protocol.plan import gpu_for_local_rank
from hvd_magic.rank import (
    collective_ddp,
    collective_tf,
    collective_time,
    debugger,
    notices,
    reporting,
    trainers,
)
from hvd_magic.rank import inbox as rank_inbox
from hvd_magic.rank.hub_client import HubClient
from hvd_magic.rank.inbox import Inbox
from hvd_magic.rank.output import OutputForwarder
from hvd_magic.rank.payload import load_payload, report_error, run_payload
from hvd_magic.rank.stalls import WaitWatch
from hvd_magic.rank.timeline_stream import TimelineStream

PAYLOAD_TIMEOUT = 120.0


def shard_for_local_rank(shards: str | None, local_rank: int) -> str | None:
    """This rank's data shard file (``data=``), from the per-local-rank list of its host."""
    paths = json.loads(shards) if shards else []
    return str(paths[local_rank]) if local_rank < len(paths) else None


def _run(
    client: HubClient,
    blob: bytes,
    rank: int,
    host: str,
    forwarder: OutputForwarder,
    connect: Callable[[], HubClient],
) -> int:
    """Run the payload (or serve a live session's cells); the rank's exit code."""
    try:
        payload = load_payload(blob)
    except BaseException as err:  # noqa: BLE001 - reported, then we exit
        report_error(client, host, err)
        return 1
    silence = payload.silence if isinstance(payload, SessionPayload) else None
    inbox = Inbox(connect(), silence, session=isinstance(payload, SessionPayload))
    rank_inbox.attach(inbox)
    if isinstance(payload, SessionPayload):
        from hvd_magic.rank.session_loop import serve

        return serve(client, inbox, payload, rank, host, forwarder.sync)
    return run_payload(client, payload, host, reply=rank == 0)


def _time_waits(client: HubClient, torch_style: bool) -> WaitWatch | None:
    """Time this rank's waits in collectives (stragglers): DDP's on torch.distributed ranks, whose
    hub also hears where they wait (the watch), Horovod TensorFlow's gradient allreduce on
    Horovod ranks (Horovod torch's are timed as soon as it is imported)."""
    if os.environ.pop(ENV_TIME_WAITS, "1") == "0":  # stragglers=off: nothing judges them
        collective_time.switch_off()
    elif torch_style:
        collective_ddp.time_ddp()
    else:
        collective_tf.time_tensorflow()
    if not torch_style:
        return None
    watch = WaitWatch(client.send)
    watch.start()
    return watch


def main() -> int:
    die_with_parent()
    if os.getppid() == 1:  # the launcher is already gone
        return 1
    rank, local_rank, size = rank_from_env()
    address = os.environ.pop(ENV_HUB)
    token = os.environ.pop(ENV_TOKEN)
    # Before anything imports a framework: each rank sees only its slot's GPUs.
    torch_style = "MASTER_PORT" in os.environ and "RANK" in os.environ  # backend=torch
    gpus = gpu_for_local_rank(os.environ.pop(ENV_SLOT_GPUS, None), local_rank, by_local_rank=torch_style)
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
    forwarder = OutputForwarder(client)
    faulthandler.enable(file=os.fdopen(forwarder.original_stderr, "w"), all_threads=True)
    reporting.attach(client)
    debugger.install()  # input() and pdb ask at the notebook
    notices.watch(client)  # a cloud's preemption notice on this machine (HVD_MAGIC_PREEMPTION)
    watch = _time_waits(client, torch_style)
    trainers.watch()  # HF's, Lightning's and Accelerate's steps in the view (HVD_MAGIC_TRAINERS=0: not)
    timeline = (
        TimelineStream(client, os.environ["HOROVOD_TIMELINE"]).start()
        if rank == 0 and os.environ.get("HOROVOD_TIMELINE") not in (None, "", TIMELINE_DYNAMIC)
        else None
    )
    code = 1
    try:
        code = _run(client, blob, rank, host, forwarder, lambda: HubClient(address, token, rank))
    finally:
        if watch is not None:
            watch.stop()
        reporting.detach()
        forwarder.close()
        if timeline is not None:
            timeline.finish()
        client.send(Exit(code))
        client.close()
    return code


def run_and_exit() -> NoReturn:
    """``main()``, then the end of a rank, started or forked (``forkserver``): atexit hooks finalize
    MPI (mpirun counts a rank that skips MPI_Finalize as failed); the interpreter's module
    teardown, where frameworks' destructors can hang a rank, is skipped."""
    exit_code, interrupted = 1, False
    try:
        exit_code = main()
    except SystemExit as stop:
        exit_code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
        traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:  # as the interpreter ends on an uncaught KeyboardInterrupt: by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(exit_code)


if __name__ == "__main__":
    run_and_exit()
