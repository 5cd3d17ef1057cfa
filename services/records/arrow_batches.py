"""Records as Apache Arrow: the columns both Arrow formats carry, built from packed columns.

``ReadRange``'s ``READ_FORMAT_ARROW_IPC`` and ``Stream``'s ``DELIVERY_FORMAT_ARROW_SHM``
carry the columns of Spark's Kafka source (:data:`SCHEMA`): key binary, value binary,
topic string, partition int32, offset int64, timestamp timestamp[us, UTC], headers
list<struct<key string, value binary>>. A missing key or value is null, a record without a
timestamp (negative) has a null timestamp, a header whose value is null carries ``b""``.

:func:`record_batch` builds one ``pa.RecordBatch`` from the columns a ``RecordBatch``
message has (packed little-endian offsets, timestamps and lengths, concatenated keys and
values, sparse headers): the sidecar's buffered chunks are kept that way
(``services/records/batches.py``), and so is what a client receives in
``DELIVERY_FORMAT_BATCHES``. It is vectorised: the key and value columns are the
concatenated bytes themselves (no copy) with offsets summed up in C++, so nothing runs per
record in Python unless records carry headers.

Pure: no I/O. pyarrow is imported by this module only; import it where Arrow is needed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dataservice.sidecar.v1 import stream_pb2
from services.records.batches import Slice, lengths_column

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
HEADERS = SCHEMA.field("headers").type
TIMESTAMP = SCHEMA.field("timestamp").type
# Packed columns are little-endian, Arrow's buffers native: they are the same bytes here.
if sys.byteorder != "little":  # pragma: no cover - every platform the mesh runs on
    raise ImportError("arrow_batches reads packed little-endian columns as Arrow buffers")

_ZERO = pa.array([0], pa.int32())
_NO_HEADER = pa.array([], HEADER)

# Bytes-like: bytes, or a memoryview of a part of a larger buffer (no copy).
Data = bytes | memoryview
# Sparse headers: (record index, [(key, value), ...]) for the records that have any.
SparseHeaders = Sequence[tuple[int, Sequence[tuple[str, bytes]]]]


def record_batch(
    topic: str,
    partition: int,
    offsets: Data,
    timestamps: Data | None,
    value_lengths: Data,
    values: Data,
    key_lengths: Data | None = None,
    keys: Data = b"",
    headers: SparseHeaders = (),
) -> pa.RecordBatch:
    """One record batch of :data:`SCHEMA` from packed columns: ``offsets`` and
    ``timestamps`` (ms, negative = none; ``None``: no record has one) int64, the lengths
    int32 (-1 = null, taking no bytes; ``key_lengths`` ``None``: every key null), as in a
    ``RecordBatch`` message. ``values`` and ``keys`` become the columns' data buffers
    without a copy: the batch keeps them alive."""
    n = len(offsets) // 8
    return pa.RecordBatch.from_arrays(
        [
            _binary(key_lengths, keys, n) if key_lengths is not None else pa.nulls(n, pa.binary()),
            _binary(value_lengths, values, n),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            _timestamps(timestamps, n),
            _headers(headers, n),
        ],
        schema=SCHEMA,
    )


def from_message(batch: stream_pb2.RecordBatch) -> pa.RecordBatch:
    """A ``RecordBatch`` message (``DELIVERY_FORMAT_BATCHES``) as Arrow; its key and value
    columns point into the message's bytes."""
    return record_batch(
        batch.topic,
        batch.partition,
        batch.offsets,
        batch.timestamps or None,
        batch.value_lengths,
        batch.values,
        batch.key_lengths or None,
        batch.keys,
        [(h.index, [(x.key, x.value) for x in h.headers]) for h in batch.headers],
    )


def from_slice(piece: Slice) -> pa.RecordBatch:
    """The records of a delivery :class:`Slice` as Arrow, straight from its chunk's columns:
    the key and value columns point into the chunk's bytes (the batch keeps them alive)."""
    chunk, lo, hi = piece.chunk, piece.lo, piece.hi

    def lengths(column: Any, nulls: frozenset[int]) -> Data:
        if nulls:
            return memoryview(lengths_column(column, lo, hi, nulls)).cast("B")
        return memoryview(column).cast("B")[lo * 4 : hi * 4]

    stamps = chunk.timestamps
    sparse = chunk.headers
    return record_batch(
        piece.topic,
        piece.partition,
        memoryview(chunk.offsets).cast("B")[lo * 8 : hi * 8],
        memoryview(stamps).cast("B")[lo * 8 : hi * 8] if stamps is not None else None,
        lengths(chunk.value_lengths, chunk.value_nulls),
        memoryview(chunk.values)[piece.vlo : piece.vhi],
        lengths(chunk.key_lengths, chunk.key_nulls) if chunk.key_lengths is not None else None,
        memoryview(chunk.keys)[piece.klo : piece.khi],
        [(k - lo, sparse[k]) for k in sorted(sparse) if lo <= k < hi] if sparse else (),
    )


def _binary(lengths: Data, data: Data, n: int) -> pa.Array:
    """A binary column: record i is the next lengths[i] bytes of ``data`` (-1: null)."""
    sizes = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(lengths)])
    validity = None
    if n and pc.min(sizes).as_py() < 0:
        valid = pc.greater_equal(sizes, 0)
        validity = valid.buffers()[1]
        sizes = pc.max_element_wise(sizes, 0)
    # Summed in int64; the cast refuses more than 2 GiB in one column.
    ends = pc.cumulative_sum(sizes).cast(pa.int32())
    bounds = pa.concat_arrays([_ZERO, ends]).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), n, [validity, bounds, pa.py_buffer(data)])


def _timestamps(packed: Data | None, n: int) -> pa.Array:
    if packed is None:
        return pa.nulls(n, TIMESTAMP)
    ms = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(packed)])
    micros = pc.multiply(ms, 1000)
    if n and pc.min(ms).as_py() < 0:
        micros = pc.if_else(pc.less(ms, 0), pa.scalar(None, pa.int64()), micros)
    return micros.view(TIMESTAMP)


def _headers(sparse: SparseHeaders, n: int) -> pa.Array:
    if not sparse:
        # No record has headers (the usual case): n empty lists, no per-record objects.
        return pa.ListArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), n + 1), _NO_HEADER, type=HEADERS
        )
    rows: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for index, pairs in sparse:
        rows[index] = [{"key": str(k), "value": v} for k, v in pairs]
    return pa.array(rows, HEADERS)
