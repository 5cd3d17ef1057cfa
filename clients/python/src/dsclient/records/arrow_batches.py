"""Records as Apache Arrow: the columns both Arrow formats carry, built from packed columns.

``ReadRange``'s ``READ_FORMAT_ARROW_IPC`` and ``Stream``'s ``DELIVERY_FORMAT_ARROW_SHM``
carry the columns of Spark's Kafka source (:data:`SCHEMA`): key binary, value binary,
topic string, partition int32, offset int64, timestamp timestamp[us, UTC], headers
list<struct<key string, value binary>>. A missing key or value is null, a record without a
timestamp (negative) has a null timestamp, a header whose value is null carries ``b""``.

:func:`record_batch` builds one ``pa.RecordBatch`` from the columns a ``RecordBatch``
message has (packed little-endian offsets, timestamps and lengths, concatenated keys and
values, sparse headers): the sidecar's buffered chunks are kept that way
(``clients/python/src/dsclient/records/batches.py``), and so is what a client receives in
``DELIVERY_FORMAT_BATCHES``. It is vectorised: the key and value columns are the
concatenated bytes themselves (no copy) with offsets summed up by numpy, so nothing runs
per record in Python unless records carry headers. numpy, not ``pyarrow.compute``: a
partition run is often a few hundred records, and a compute call costs 10-15 µs before it
does anything (a run cost 101 µs, 370 ns a record at 1 KiB, with six of them).

Pure: no I/O. pyarrow is imported by this module only; import it where Arrow is needed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from dataservice.sidecar.v1 import stream_pb2
from dsclient.records.batches import Slice, lengths_column

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

_MAX_BINARY = 2**31 - 1  # a binary column's offsets are int32
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
            pa.repeat(_topic(topic), n),  # one value n times, in C++
            pa.repeat(_partition(partition), n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            _timestamps(timestamps, n),
            _headers(headers, n),
        ],
        schema=SCHEMA,
    )


def rows_batch(
    topic: str | Sequence[str],
    partition: int | Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    offsets: Sequence[int],
    stamps_us: Sequence[int | None],
    headers: Sequence[Sequence[dict[str, Any]]] | None = None,
) -> pa.RecordBatch:
    """One record batch of :data:`SCHEMA` from rows already taken apart (Python lists, one
    item a record): the sidecar's ``READ_FORMAT_ARROW_IPC`` chunks and the Spark source's
    RECORDS chunks are built here, so the schema has one builder for packed columns
    (:func:`record_batch`) and this one for rows. ``topic`` and ``partition``: one for
    every row (repeated in C++) or one a row; ``stamps_us``: microseconds, ``None`` for
    none; ``headers``: a list of ``{"key", "value"}`` a row, ``None`` when no row has any."""
    n = len(offsets)
    topics = (
        pa.repeat(pa.scalar(topic, pa.string()), n)
        if isinstance(topic, str)
        else pa.array(topic, pa.string())
    )
    partitions = (
        pa.repeat(pa.scalar(partition, pa.int32()), n)
        if isinstance(partition, int)
        else pa.array(partition, pa.int32())
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            topics,
            partitions,
            pa.array(offsets, pa.int64()),
            # Microseconds as int64 viewed as the zoned type: building a zoned timestamp
            # array from Python objects would import pandas (about 1 s in a fresh process).
            pa.array(stamps_us, pa.int64()).view(TIMESTAMP),
            pa.array(headers, HEADERS) if headers is not None else no_headers(n),
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
    if len(data) > _MAX_BINARY:
        raise ValueError(f"{len(data)} bytes in one binary column (at most {_MAX_BINARY})")
    sizes = np.frombuffer(lengths, np.int32, n)
    validity = None
    nulls = sizes < 0
    if nulls.any():
        validity = _bitmap(~nulls)
        sizes = np.where(nulls, 0, sizes)
    bounds = np.empty(n + 1, np.int32)  # the sum is len(data): it fits
    bounds[0] = 0
    np.cumsum(sizes, out=bounds[1:])
    return pa.Array.from_buffers(
        pa.binary(), n, [validity, pa.py_buffer(bounds), pa.py_buffer(data)]
    )


def _timestamps(packed: Data | None, n: int) -> pa.Array:
    if packed is None:
        return pa.nulls(n, TIMESTAMP)
    ms = np.frombuffer(packed, np.int64, n)
    missing = ms < 0
    validity = _bitmap(~missing) if missing.any() else None
    micros = pa.py_buffer(ms * 1000)
    return pa.Array.from_buffers(TIMESTAMP, n, [validity, micros])


def _bitmap(valid: np.ndarray) -> pa.Buffer:
    """Arrow's validity bitmap (least significant bit first) of a boolean array."""
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def no_headers(n: int) -> pa.Array:
    """The headers column of n records without any: n empty lists, no per-record objects."""
    empty = pa.py_buffer(np.zeros(n + 1, np.int32))
    return pa.Array.from_buffers(HEADERS, n, [None, empty], children=[_NO_HEADER])


def _headers(sparse: SparseHeaders, n: int) -> pa.Array:
    if not sparse:
        return no_headers(n)  # the usual case
    rows: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for index, pairs in sparse:
        rows[index] = [{"key": str(k), "value": v} for k, v in pairs]
    return pa.array(rows, HEADERS)


@functools.lru_cache(maxsize=1024)
def _topic(name: str) -> pa.Scalar:
    return pa.scalar(name, pa.string())


@functools.lru_cache(maxsize=4096)
def _partition(number: int) -> pa.Scalar:
    return pa.scalar(number, pa.int32())
