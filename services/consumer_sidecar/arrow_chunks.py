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


_NO_HEADERS: list[dict[str, str | bytes]] = []


class Columns:
    """One chunk of one partition's messages, kept column by column as the chunker takes
    them: each message's accessors are called once (:meth:`add` keeps the row and says its
    size), and the topic and partition are the partition's, once.

    The range reader's loop costs about a microsecond per accessor call: measuring a row
    and then encoding it from the message again called eleven of them per record, this
    calls five.
    """

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._row_overhead = len(topic.encode()) + ROW_OVERHEAD
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.stamps: list[int | None] = []
        self.headers: list[list[dict[str, str | bytes]]] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, msg: Message) -> tuple[int, int]:
        """Keep the message's row; (bytes it adds to the stream at most, its key plus
        value bytes). A row that does not fit after all is taken back with :meth:`pop`."""
        key, value = msg.key(), msg.value()
        if key is not None and type(key) is not bytes:  # confluent-kafka gives bytes
            key = _raw(key)
        if value is not None and type(value) is not bytes:
            value = _raw(value)
        payload = (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        size = payload + self._row_overhead
        raw_headers = msg.headers()
        headers = _NO_HEADERS
        if raw_headers:
            headers = []
            for hkey, hvalue in raw_headers:
                hbytes = _raw(hvalue) or b""
                size += len(hkey) + len(hbytes) + HEADER_OVERHEAD
                headers.append({"key": str(hkey), "value": hbytes})
        self.keys.append(key)
        self.values.append(value)
        self.offsets.append(msg.offset() or 0)
        kind, ms = msg.timestamp()  # kind 0: TIMESTAMP_NOT_AVAILABLE
        self.stamps.append(ms * 1000 if kind != 0 and ms >= 0 else None)
        self.headers.append(headers)
        return size, payload

    def pop(self) -> int:
        """Take the last row back; its offset."""
        self.keys.pop()
        self.values.pop()
        self.stamps.pop()
        self.headers.pop()
        return self.offsets.pop()

    def encode(self) -> bytes:
        """The rows taken as one Arrow IPC stream of one record batch (see the module doc)."""
        n = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([self.topic] * n, pa.string()),
                pa.array([self.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                # Microseconds as int64 viewed as the zoned type (no pandas, no per-value
                # objects).
                pa.array(self.stamps, pa.int64()).view(SCHEMA.field("timestamp").type),
                pa.array(self.headers, SCHEMA.field("headers").type),
            ],
            schema=SCHEMA,
        )
        sink = pa.BufferOutputStream()
        with pa_ipc.new_stream(sink, SCHEMA) as writer:
            writer.write_batch(batch)
        data: bytes = sink.getvalue().to_pybytes()
        return data


def encode(messages: Sequence[Message]) -> bytes:
    """Messages of one partition as one Arrow IPC stream of one record batch."""
    msgs = list(messages)
    if not msgs:
        return Columns("", 0).encode()
    columns = Columns(str(msgs[0].topic()), int(msgs[0].partition() or 0))
    for msg in msgs:
        if (msg.topic(), msg.partition()) != (columns.topic, columns.partition):
            raise ValueError("one chunk holds the records of one partition")
        columns.add(msg)
    return columns.encode()
