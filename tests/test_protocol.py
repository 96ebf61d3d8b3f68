"""The wire protocol alone: every kind round-trips, junk is refused, the plan survives JSON."""

from __future__ import annotations

import json
import pathlib

import pytest

import hvd_magic
from hvd_magic import protocol
from hvd_magic.protocol import (
    GlooSlot,
    Kind,
    Log,
    LogDecoder,
    Message,
    Plan,
    PlanHost,
    SparkPlan,
    decode,
    encode,
)

PLAN = SparkPlan(
    hosts=[
        PlanHost("hvd-host-0", "a:1", "10.0.0.1", [0, 2], [["0"], ["1"]], agent="tcp://10.0.0.1:5"),
        PlanHost("hvd-host-1", "b:1", "10.0.0.2", [1], [[]]),
    ],
    mpirun_partition=0,
    slots={0: GlooSlot("hvd-host-0", 0, 3, 0, 2, 0, 2), 1: GlooSlot("hvd-host-1", 2, 3, 0, 1, 1, 2)},
)

EXAMPLES = {
    Kind.HELLO: protocol.Hello(),
    Kind.PAYLOAD: protocol.Payload(),
    Kind.STARTED: protocol.Started("vm", 123, 1, 4),
    Kind.LOG: protocol.Log("stderr"),
    Kind.REPORTS: protocol.Reports(dropped=3),
    Kind.ERROR: protocol.RankError("vm", "ValueError", "bad ✓", "Traceback ..."),
    Kind.STALL: protocol.Stall([0, 2], [["allreduce.t3"], ["allreduce.t3", "allreduce.t4"]], 15.0),
    Kind.WAITING: protocol.Waiting("all_reduce", "line 5 of the cell", 2.5),
    Kind.STRAGGLER: protocol.Straggler(1, "vm", 0.4, 1.2, 0.7, 10.0, "data wait", recovered=True),
    Kind.RESULT: protocol.Result(),
    Kind.FILE: protocol.FileChunk("timeline", last=True),
    Kind.EXIT: protocol.Exit(130),
    Kind.JOIN: protocol.Join(2, "exec-1", "10.0.0.2", ["0"], "/usr/bin/python3", "tcp://10.0.0.2:7"),
    Kind.PLAN: Plan(PLAN),
    Kind.LAUNCHER_LOG: protocol.LauncherLog(),
    Kind.LAUNCHER_EXIT: protocol.LauncherExit(1),
    Kind.RELEASE: protocol.Release(),
    Kind.ABORT: protocol.Abort(),
    Kind.STOPPED: protocol.Stopped("exec-1", ["123: mpirun -np 2 ..."]),
    Kind.STORE: protocol.StoreRequest(7, "PUT", "/global/0"),
    Kind.STORED: protocol.StoreAnswer(7, 404),
    Kind.EXEC: protocol.Exec("orted --foo"),
    Kind.OUTPUT: protocol.Output("stdout"),
    Kind.PING: protocol.Ping(),
    Kind.PONG: protocol.Pong(),
    Kind.KILL: protocol.Kill(),
    Kind.CELL: protocol.Cell(7, reply=2),
    Kind.CELL_DONE: protocol.CellDone(7, ok=False),
    Kind.INTERRUPT: protocol.Interrupt(7),
    Kind.BEAT: protocol.Beat(),
    Kind.RANK_STATUS: protocol.RankStatus(
        busy=7, cells=3, rss=123_456_789, cpu=87.5, cores=2, host_cpu=93.0, swapped=4096
    ),
    Kind.RESUME: protocol.ResumeRequest(4),
    Kind.RESUMED: protocol.ResumeAnswer(4, step=1200, found=True),
    Kind.KEPT_ASK: protocol.KeptRequest(5, step=1200),
    Kind.KEPT: protocol.KeptAnswer(5, kept=True),
    Kind.PROMPT: protocol.Prompt(3, "> <horovod cell>(2)<module>()\n-> x = 1\n(Pdb) ", debugger=True),
    Kind.TYPED: protocol.Typed(3, "p x"),
    Kind.DEBUGGER_LEFT: protocol.DebuggerLeft("--Return--\n"),
    Kind.NOTICED: protocol.Noticed("AWS spot interruption notice: {...}"),
    Kind.TIMING_OFF: protocol.TimingOff(0.087, 0.00141, 0.01),
    Kind.NATIVE_ASKED: protocol.NativeAsked(3, [1, 2], [4242, 4343]),
    Kind.NATIVE_DUMPS: protocol.NativeDumps(3, [1], ["Thread 4242 (idle): ..."]),
    Kind.STOP_ASKED: protocol.StopAsked("Spark is decommissioning executor 2 (10.0.0.3)"),
    Kind.POLLING: protocol.Polling(),
    Kind.STACKS_ASKED: protocol.StacksAsked(7),
    Kind.STACKS: protocol.RankStacks(
        7, main=[["<horovod cell>", 3, "<module>", "loss = step()"]], others=[["loader", "get (q.py:180)"]]
    ),
}


def test_every_kind_has_a_record_and_round_trips():
    assert set(EXAMPLES) == set(Kind)
    for kind, record in EXAMPLES.items():
        assert record.KIND is kind
        frames = encode(record, rank=5, blob=b"\x00blob")
        assert frames[0] == kind.value.encode()
        message = decode(frames, identity=b"peer")
        assert message is not None, kind
        assert (message.record, message.rank, message.blob, message.identity) == (
            record,
            5,
            b"\x00blob",
            b"peer",
        )
        assert message.kind is kind


@pytest.mark.parametrize(
    "frames",
    [
        [b"no-such-kind", b"{}", b""],
        [b"exit", b"not json", b""],
        [b"exit", b'{"rank": 0}', b""],  # a required field missing
        [b"exit", b'{"rank": "zero", "code": 1}', b""],
        [b"exit", b"[1, 2]", b""],
        [b"\xff", b"{}", b""],
        [b"exit", b'{"code": 0}'],  # a frame short
    ],
)
def test_what_is_not_one_of_our_messages_decodes_to_none(frames):
    assert decode(frames) is None


def test_the_spark_plan_survives_json_as_the_tasks_get_it():
    wire = json.loads(json.dumps(PLAN.to_json()))
    assert SparkPlan.from_json(wire) == PLAN
    assert PLAN.host_of(2).token == "hvd-host-0" and PLAN.host_of(1).token == "hvd-host-1"
    assert PLAN.slots[1].env()["HOROVOD_CROSS_RANK"] == "1"


def test_log_text_is_decoded_per_rank_and_stream_across_chunk_boundaries():
    decoder = LogDecoder()
    text = "épreuve ✓ 🚀\n".encode()
    pieces = [text[i : i + 1] for i in range(len(text))]  # the worst case: a byte at a time
    out = ""
    for index, piece in enumerate(pieces):
        out += decoder.text(Message(Log("stdout"), 0, piece))
        decoder.text(Message(Log("stdout"), 1, b"\xc3"))  # another rank's dangling byte
        if index == 3:
            assert decoder.text(Message(Log("stderr"), 0, b"err\n")) == "err\n"
    assert out == "épreuve ✓ 🚀\n"


def test_no_module_but_the_protocol_spells_a_kind():
    package = pathlib.Path(hvd_magic.__file__).parent
    quoted = [f'"{kind.value}"' for kind in Kind if "_" in kind.value or len(kind.value) > 4]
    offenders = []
    for path in package.rglob("*.py"):
        if path.parent.name == "protocol":
            continue
        source = path.read_text()
        offenders += [f"{path.name}: {word}" for word in quoted if word in source]
    assert offenders == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"},
            (3, 1, 4),
        ),
        ({"HOROVOD_RANK": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_SIZE": "3", "RANK": "9"}, (2, 0, 3)),
        ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 0, 2)),  # backend=torch; no LOCAL_RANK: 0
        ({"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "1"}, (5, 1, 6)),
        ({"PATH": "/bin"}, (0, 0, 1)),  # no launcher: a run of one
    ],
)
def test_a_rank_reads_its_place_from_whichever_launcher_started_it(env, expected):
    from hvd_magic.protocol.env import rank_from_env

    assert rank_from_env(env) == expected
