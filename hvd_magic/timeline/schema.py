"""The columns every timeline reader produces."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["SCHEMA"]

SCHEMA = pa.schema(
    [
        ("ph", pa.string()),
        ("name", pa.string()),
        ("ts", pa.int64()),
        ("dur", pa.int64()),
        ("pid", pa.int64()),
        ("args", pa.struct([("name", pa.string()), ("start_time_since_epoch_in_micros", pa.int64())])),
    ]
)
