"""The contract between the notebook, the Spark tasks, the exec agents and the ranks: message
kinds and their typed records (``messages``, where the table of who sends what is, and
``task_messages``), how they
travel (``wire``), environment names (``env``), payloads (``payload``) and the Spark plan
(``plan``). Plain data, no I/O."""

from __future__ import annotations

from .env import (
    ENV_AGENT_TOKEN,
    ENV_AGENTS,
    ENV_HUB,
    ENV_SHARD,
    ENV_SHARDS,
    ENV_SLOT_GPUS,
    ENV_TOKEN,
    ENV_VIA_AGENT,
)
from .messages import (
    Exit,
    FileChunk,
    Hello,
    Kind,
    Log,
    Payload,
    RankError,
    Record,
    Reports,
    Result,
    Stall,
    Started,
    Waiting,
    record_type,
)
from .payload import (
    CELL_FILENAME,
    CellPayload,
    FunctionPayload,
)
from .plan import (
    GlooSlot,
    PlanHost,
    SparkPlan,
)
from .task_messages import (
    Abort,
    Exec,
    Join,
    Kill,
    LauncherExit,
    LauncherLog,
    Output,
    Ping,
    Plan,
    Pong,
    Release,
    Stopped,
    StoreAnswer,
    StoreRequest,
)
from .wire import (
    CONTROL_RECORDS,
    LogDecoder,
    Message,
    decode,
    encode,
)

__all__ = [
    "Abort",
    "CELL_FILENAME",
    "CONTROL_RECORDS",
    "CellPayload",
    "ENV_AGENTS",
    "ENV_AGENT_TOKEN",
    "ENV_HUB",
    "ENV_SHARD",
    "ENV_SHARDS",
    "ENV_SLOT_GPUS",
    "ENV_TOKEN",
    "ENV_VIA_AGENT",
    "Exec",
    "Exit",
    "FileChunk",
    "FunctionPayload",
    "GlooSlot",
    "Hello",
    "Join",
    "Kill",
    "Kind",
    "LauncherExit",
    "LauncherLog",
    "Log",
    "LogDecoder",
    "Message",
    "Output",
    "Payload",
    "Ping",
    "Plan",
    "PlanHost",
    "Pong",
    "RankError",
    "Record",
    "Release",
    "Reports",
    "Result",
    "SparkPlan",
    "Stall",
    "Started",
    "Stopped",
    "StoreAnswer",
    "StoreRequest",
    "Waiting",
    "decode",
    "encode",
    "record_type",
]
