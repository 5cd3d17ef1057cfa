"""``ReadRange``'s ``READ_FORMAT_ARROW_IPC`` chunks: Kafka messages straight into one Arrow
IPC stream, column by column, with no protobuf ``Record`` per message (the RECORDS format's
cost, paid again on the Spark executor that turned records into Arrow).

The columns are those stream.proto documents and Spark's Kafka source has: key binary,
value binary, topic string, partition int32, offset int64, timestamp timestamp[us, UTC],
headers list<struct<key string, value binary>>. A value the RECORDS format would carry
identically is carried identically here: a missing key or value is null, a message without a
timestamp (type NOT_AVAILABLE, or negative) has a null timestamp, and a header whose value is
null carries ``b""`` (a protobuf ``Header`` cannot hold null), so the Spark source builds the
same rows from either format.

pyarrow is imported by this module only: the sidecar imports it on the first ``ARROW_IPC``
request, so sidecars that never serve Spark never load it. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import pyarrow as pa
import pyarrow.ipc as pa_ipc

HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", pa.list_(HEADER)),
    ]
)
# Per row besides key, value, topic and header bytes: the offsets of the five variable-width
# columns (4 B each), partition 4, offset 8, timestamp 8, validity bits; rounded up.
ROW_OVERHEAD = 40
HEADER_OVERHEAD = 8  # a header's key and value offsets
# Per stream: the schema message, the record batch's metadata and the 8-byte padding of each
# buffer, the end-of-stream marker and the response's own field framing; measured at about
# 1.3 KiB for this schema, kept at 4 KiB so a chunk never exceeds the response limit.
STREAM_OVERHEAD = 4096


class Message(Protocol):
    """What the encoder reads of a confluent-kafka ``Message``."""

    def key(self) -> bytes | str | None: ...
    def value(self) -> bytes | str | None: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def headers(self) -> list[tuple[str, bytes | str | None]] | None: ...


def _raw(data: bytes | str | None) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    return str(data).encode()


def row_bytes(msg: Message) -> tuple[int, int]:
    """(what the message adds to a chunk's IPC stream, at most; its key plus value bytes)."""
    key, value = msg.key(), msg.value()
    payload = (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    size = payload + len(msg.topic() or "") + ROW_OVERHEAD
    for hkey, hvalue in msg.headers() or ():
        size += len(hkey) + (len(hvalue) if hvalue is not None else 0) + HEADER_OVERHEAD
    return size, payload


def _stamp(kind_and_ms: tuple[int, int]) -> int | None:
    kind, ms = kind_and_ms
    return ms * 1000 if kind != 0 and ms >= 0 else None  # 0: TIMESTAMP_NOT_AVAILABLE


def encode(messages: Sequence[Message]) -> bytes:
    """The messages as one Arrow IPC stream of one record batch (see the module doc)."""
    msgs = list(messages)
    headers = [
        [{"key": str(k), "value": _raw(v) or b""} for k, v in (m.headers() or ())] for m in msgs
    ]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([_raw(m.key()) for m in msgs], pa.binary()),
            pa.array([_raw(m.value()) for m in msgs], pa.binary()),
            pa.array([str(m.topic()) for m in msgs], pa.string()),
            pa.array([int(m.partition() or 0) for m in msgs], pa.int32()),
            pa.array([int(m.offset() or 0) for m in msgs], pa.int64()),
            # Microseconds as int64 viewed as the zoned type (no pandas, no per-value objects).
            pa.array([_stamp(m.timestamp()) for m in msgs], pa.int64()).view(
                SCHEMA.field("timestamp").type
            ),
            pa.array(headers, SCHEMA.field("headers").type),
        ],
        schema=SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa_ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data
