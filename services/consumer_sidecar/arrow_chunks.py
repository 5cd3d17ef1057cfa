"""``ReadRange``'s ``READ_FORMAT_ARROW_IPC`` chunks: Kafka messages straight into one Arrow
IPC stream, column by column, with no protobuf ``Record`` per message (the RECORDS format's
cost, paid again on the Spark executor that turned records into Arrow).

The columns are those stream.proto documents and Spark's Kafka source has
(``dsclient/records/arrow_batches.py``'s SCHEMA, which ``DELIVERY_FORMAT_ARROW_SHM``
shares). A value the RECORDS format would carry identically is carried identically here: a
missing key or value is null, a message without a timestamp (type NOT_AVAILABLE, or
negative) has a null timestamp, and a header whose value is null carries ``b""`` (a
protobuf ``Header`` cannot hold null), so the Spark source builds the same rows from
either format.

pyarrow is imported by the Arrow modules only (this one and ``arrow_batches``): the sidecar
imports them on the first Arrow request, so sidecars that never serve one never load it.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Protocol, cast

import pyarrow as pa
import pyarrow.ipc as pa_ipc

from dsclient.records.arrow_batches import SCHEMA, rows_batch

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
_PLAIN = frozenset({bytes, type(None)})


def _all_raw(items: list[bytes | str | None]) -> bool:
    """Every item bytes or None (what confluent-kafka gives), checked at C speed."""
    return set(map(type, items)) <= _PLAIN


def _headers(raw: list[tuple[str, bytes | str | None]]) -> tuple[list[dict[str, str | bytes]], int]:
    """A message's headers as the column's structs, and the bytes they add to its row."""
    rows: list[dict[str, str | bytes]] = []
    size = 0
    for hkey, hvalue in raw:
        hbytes = _raw(hvalue) or b""
        size += len(hkey) + len(hbytes) + HEADER_OVERHEAD
        rows.append({"key": str(hkey), "value": hbytes})
    return rows, size


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
            headers, extra = _headers(raw_headers)
            size += extra
        self.keys.append(key)
        self.values.append(value)
        self.offsets.append(msg.offset() or 0)
        kind, ms = msg.timestamp()  # kind 0: TIMESTAMP_NOT_AVAILABLE
        self.stamps.append(ms * 1000 if kind != 0 and ms >= 0 else None)
        self.headers.append(headers)
        return size, payload

    def add_many(self, msgs: Sequence[Message], room: int) -> tuple[int, int, int]:
        """Keep the rows of the first messages of ``msgs`` that fit in ``room`` bytes (at
        least one while the chunk is empty, whatever its size): (how many, the bytes they
        add to the stream at most, their key plus value bytes); the same rows, sizes and
        cut as :meth:`add` message by message.

        Column by column, one comprehension per accessor: the per-message Python of
        :meth:`add` (a call, its locals, six list appends) cost more than the accessors."""
        raw_keys = [m.key() for m in msgs]
        raw_values = [m.value() for m in msgs]
        raw_headers = [m.headers() for m in msgs]
        if _all_raw(raw_keys) and _all_raw(raw_values):
            keys = cast("list[bytes | None]", raw_keys)
            values = cast("list[bytes | None]", raw_values)
        else:
            keys, values = [_raw(k) for k in raw_keys], [_raw(v) for v in raw_values]
        payloads = [
            (0 if k is None else len(k)) + (0 if v is None else len(v))
            for k, v in zip(keys, values, strict=True)
        ]
        headers: list[list[dict[str, str | bytes]]] = [_NO_HEADERS] * len(msgs)
        sizes = payloads
        if any(raw_headers):
            sizes = list(payloads)
            for i, raw in enumerate(raw_headers):
                if raw:
                    headers[i], extra = _headers(raw)
                    sizes[i] += extra
        overhead = self._row_overhead
        ends = list(accumulate(sizes))  # ends[i] + (i + 1) * overhead: rows 0..i's bytes
        taken = bisect_right(range(len(ends)), room, key=lambda i: ends[i] + (i + 1) * overhead)
        if taken == 0 and not self.offsets and msgs:
            taken = 1
        if taken == 0:
            return 0, 0, 0
        kept = msgs[:taken] if taken < len(msgs) else msgs
        self.keys += keys[:taken]
        self.values += values[:taken]
        self.headers += headers[:taken]
        self.offsets += [m.offset() or 0 for m in kept]
        self.stamps += [
            ms * 1000 if kind != 0 and ms >= 0 else None
            for kind, ms in [m.timestamp() for m in kept]
        ]
        return taken, ends[taken - 1] + taken * overhead, sum(payloads[:taken])

    def pop(self) -> int:
        """Take the last row back; its offset."""
        self.keys.pop()
        self.values.pop()
        self.stamps.pop()
        self.headers.pop()
        return self.offsets.pop()

    def encode(self) -> bytes:
        """The rows taken as one Arrow IPC stream of one record batch (see the module doc)."""
        batch = rows_batch(
            self.topic,
            self.partition,
            self.keys,
            self.values,
            self.offsets,
            self.stamps,
            # No message has headers (the usual case): the column without per-row objects.
            self.headers if any(self.headers) else None,
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
