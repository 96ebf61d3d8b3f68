"""Messages on the wire: three frames (kind, JSON header, blob), and the text of ``Log`` blobs."""

from __future__ import annotations

import codecs
import functools
import json
from dataclasses import dataclass
from typing import Any

from hvd_magic.protocol.messages import Kind, Log, Record, record_type
from hvd_magic.protocol.task_messages import Join, LauncherExit, LauncherLog, Stopped

__all__ = ["CONTROL_RECORDS", "LogDecoder", "Message", "decode", "encode"]

# What Spark tasks tell the driver's launcher (the hub queues them apart from rank events).
CONTROL_RECORDS = (Join, LauncherLog, LauncherExit, Stopped)


@dataclass
class Message:
    """One message: its record, the sender's rank, the blob; ``identity`` is the sender's
    connection, on the receiving side (to answer it)."""

    record: Record
    rank: int = -1
    blob: bytes = b""
    identity: bytes = b""

    @property
    def kind(self) -> Kind:
        return self.record.KIND

    @functools.cached_property
    def reports(self) -> Any:
        """A ``Reports`` message's records, its blob's JSON list: decoded once for every reader
        (the view, the straggler watch, the scalar sinks). A ValueError where it is not JSON."""
        return json.loads(self.blob)


def encode(record: Record, rank: int = -1, blob: bytes = b"") -> list[bytes]:
    """The frames of one message (the connection's identity frame is the transport's)."""
    header = {"rank": rank, **record.header()}
    return [record.KIND.value.encode(), json.dumps(header).encode(), blob]


def decode(frames: list[bytes], identity: bytes = b"") -> Message | None:
    """The message in ``frames`` (kind, header, blob), or None if it is not one of ours."""
    if len(frames) != 3:
        return None
    kind_raw, header_raw, blob = frames
    try:
        record_class = record_type(Kind(kind_raw.decode()))
        header = json.loads(header_raw)
        rank = int(header.pop("rank", -1))
        record = record_class.from_header(header)
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError, KeyError):
        return None
    return Message(record, rank, blob, identity=identity)


class LogDecoder:
    """Text of ``Log`` blobs, decoded per (rank, stream) incrementally: ranks send their output
    in chunks as written, and a character split across two chunks must stay one character."""

    def __init__(self) -> None:
        self._decoders: dict[tuple[int, str], codecs.IncrementalDecoder] = {}

    def text(self, message: Message) -> str:
        assert isinstance(message.record, Log)
        key = (message.rank, message.record.stream)
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = self._decoders[key] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return decoder.decode(message.blob)
