"""Records as columns: what the sidecar buffers, what it sends, what the client reads.

Python work per record is what bounds a sidecar's throughput (one Python process relays
every record), so records never become one Python object each on their way through it.
The sidecar's fetch thread turns a ``consume()`` batch into one :class:`Chunk` per
partition run (``services/consumer_sidecar/runs.py``) — offsets, timestamps and key/value
lengths in ``array``\\ s, keys and values concatenated into one ``bytes`` each
(:func:`chunk_of`). Delivery hands out :class:`Slice`\\ s of chunks; a slice becomes one
``RecordBatch`` (``DELIVERY_FORMAT_BATCHES``: packed little-endian columns, so encoding is
a few memory copies) or, for clients that predate it, one ``common.v1.Record`` per record.
The client turns a ``RecordBatch`` back into :class:`DsRecord` tuples, column by column
(:class:`Columns`, :func:`decode_batch`).

Pure code: no I/O, no locks (the partition table serializes access to its chunks).
"""

from __future__ import annotations

import io
import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add
from typing import Any, NamedTuple

from google.protobuf import timestamp_pb2

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2

# Per-record bookkeeping counted against the buffer cap, besides key and value: a chunk's
# arrays take 24 bytes a record; the rest is slack for headers and the chunk objects.
RECORD_OVERHEAD_BYTES = 96
# A header's bytes besides its key and value in a response (tags and lengths), counted with
# them in the byte budget (issue 37, finding 8: headers were left out of it).
HEADER_OVERHEAD_BYTES = 8
NO_TIMESTAMP = -1
NULL_LENGTH = -1
_BIG_ENDIAN = sys.byteorder == "big"  # the wire columns are little-endian

Headers = list[tuple[str, bytes]]
# Bytes data[lo:hi] of a buffer, as (data, lo, hi): a part of a received message.
Region = tuple[bytes, int, int]


class DsRecord(NamedTuple):
    """One record as an application reads it (immutable; built column-wise, cheaply).

    Attributes:
        topic: The Kafka topic.
        partition: The partition of ``topic``.
        offset: The record's offset in that partition.
        key: The key; ``None`` for a Kafka null.
        value: The value; ``None`` for a Kafka null.
        timestamp_ms: The record's timestamp in ms since the epoch; -1 when it has none.
        headers: ``None``, or a list of (key, value) pairs in Kafka order.
        lease_epoch: The epoch of the lease the record was delivered under; its ack
            echoes it, and a sidecar refuses an ack of an older epoch (ARCHITECTURE §3).
        delivery_count: How many times the sidecar has delivered the record under that
            lease, this time included: 1 the first time, more when it comes again because
            it was not acked in time, was nacked, or went to a client or stream that ended.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers | None
    lease_epoch: int
    delivery_count: int = 1


@dataclass(eq=False, slots=True)
class Chunk:
    """Consecutively fetched records of one partition, as columns. Record ``k`` has offset
    ``offsets[k]`` and a value of ``value_lengths[k]`` bytes in ``values`` (``None`` if
    ``k`` is in ``value_nulls``; a null takes no bytes), a key likewise (every key is
    ``None`` when ``key_lengths`` is ``None``). ``start`` is the first record not yet
    delivered, ``value_pos``/``key_pos`` where its value and key begin."""

    offsets: array[int]
    timestamps: array[int] | None  # ms, -1 = none; None = no record has one
    values: bytes
    value_lengths: array[int]
    keys: bytes = b""
    key_lengths: array[int] | None = None
    value_nulls: frozenset[int] = frozenset()
    key_nulls: frozenset[int] = frozenset()
    headers: dict[int, Headers] | None = None
    start: int = 0
    value_pos: int = 0
    key_pos: int = 0
    # With headers: header_ends[k] is the header bytes of records 0..k-1 (len(self) + 1).
    header_ends: array[int] | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def remaining_bytes(self) -> int:
        """Key, value, header and bookkeeping bytes of the records not yet delivered."""
        data = len(self.values) - self.value_pos + len(self.keys) - self.key_pos
        if self.header_ends is not None:
            data += self.header_ends[-1] - self.header_ends[self.start]
        return data + RECORD_OVERHEAD_BYTES * (len(self) - self.start)

    def fitting(self, count: int, budget: int) -> int:
        """How many of the next ``count`` undelivered records fit in ``budget`` bytes."""
        lo, hi = self.start, min(len(self), self.start + count)
        if self.remaining_bytes() <= budget:  # all that is left fits, so any part of it
            return hi - lo
        sizes: Iterable[int] = self.value_lengths[lo:hi]
        if self.key_lengths is not None:
            sizes = map(add, sizes, self.key_lengths[lo:hi])
        cumulative = list(accumulate(map(add, sizes, repeat(RECORD_OVERHEAD_BYTES))))
        if self.header_ends is not None:
            ends, base = self.header_ends, self.header_ends[lo]
            cumulative = [c + ends[lo + i + 1] - base for i, c in enumerate(cumulative)]
        return bisect_right(cumulative, budget)

    def take(self, count: int, topic: str, partition: int, epoch: int) -> Slice:
        """The next ``count`` undelivered records, marked taken (a first delivery)."""
        lo, hi = self.start, self.start + count
        vlo, klo = self.value_pos, self.key_pos
        if hi == len(self):
            vhi, khi = len(self.values), len(self.keys)
        else:
            vhi = vlo + sum(self.value_lengths[lo:hi])
            khi = klo + (sum(self.key_lengths[lo:hi]) if self.key_lengths is not None else 0)
        self.start, self.value_pos, self.key_pos = hi, vhi, khi
        return Slice(topic, partition, epoch, self, lo, hi, vlo, vhi, klo, khi)

    def skip_below(self, offset: int) -> None:
        """Drop (as already delivered) the records below ``offset``: a re-fetch after a seek."""
        while self.start < len(self) and self.offsets[self.start] < offset:
            self.value_pos += self.value_lengths[self.start]
            if self.key_lengths is not None:
                self.key_pos += self.key_lengths[self.start]
            self.start += 1


# ---- building chunks ---------------------------------------------------------------------


def chunk_of(
    offsets: array[int],
    timestamps: array[int] | None,
    values: list[bytes | None],
    keys: list[bytes | None],
    headers: list[Any],
) -> Chunk:
    """A chunk of records given column by column: ``values``/``keys`` one per record
    (``None`` = a Kafka null), ``headers`` one list of (key, value) pairs or ``None`` per
    record (a header value may be ``str``, as confluent-kafka gives it)."""
    n = len(offsets)
    # Every value null: no bytes, each length 0, all of them nulls.
    blob, lengths, value_nulls = _column(values) or (b"", array("i", [0]) * n, frozenset(range(n)))
    # Every key null (a keyless producer's records): no key columns at all.
    key_blob, key_lengths, key_nulls = (_column(keys) if n else None) or (b"", None, frozenset())
    sparse: dict[int, Headers] | None = None
    if headers.count(None) != n:
        sparse = {
            k: [(str(hk), _as_bytes(hv)) for hk, hv in hs] for k, hs in enumerate(headers) if hs
        }
    return Chunk(
        offsets=offsets,
        timestamps=timestamps,
        values=blob,
        value_lengths=lengths,
        keys=key_blob,
        key_lengths=key_lengths,
        value_nulls=value_nulls,
        key_nulls=key_nulls,
        headers=sparse or None,
        header_ends=_header_ends(sparse, n) if sparse else None,
    )


def _header_ends(headers: dict[int, Headers], n: int) -> array[int]:
    """Running totals of the records' header bytes: element k covers records 0..k-1."""
    sizes = [0] * n
    for k, pairs in headers.items():
        sizes[k] = sum(len(hk) + len(hv) + HEADER_OVERHEAD_BYTES for hk, hv in pairs)
    return array("q", [0, *accumulate(sizes)])


def _column(
    items: list[bytes | None],
) -> tuple[bytes, array[int], frozenset[int]] | None:
    """The items joined, the length of each, and the indexes of the nulls (``None``: no
    bytes, length 0); ``None`` when every item is null. Items are bytes (the consumer has
    no deserializer).

    Without nulls, the common case, this is two C-level passes (join, len) and nothing
    looks for nulls: a null makes the join raise, and only then are they sought. Looking
    first (``None in items``) cost a third pass that compares every item with None
    (bytes.__eq__ both ways), 35-80 ns a record; all-null keys went through a Python
    generator over every record (tests/bench/profile_sidecar.py)."""
    try:
        joined = b"".join(items)  # type: ignore[arg-type]
    except TypeError:  # a null among them
        pass
    else:
        # array() from a list, not an iterator: a third faster (runs.py).
        return joined, array("i", list(map(len, items))), frozenset()  # type: ignore[arg-type]
    if items.count(None) == len(items):
        return None
    nulls = frozenset(k for k, item in enumerate(items) if item is None)
    parts = [b"" if item is None else item for item in items]
    return b"".join(parts), array("i", list(map(len, parts))), nulls


def _as_bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value if isinstance(value, bytes) else str(value).encode()


def chunk_from_records(records: Sequence[common_pb2.Record]) -> Chunk:
    """A chunk from Record messages (tests, and any caller holding Records)."""
    stamped = any(r.HasField("timestamp") for r in records)
    return chunk_of(
        array("q", (r.offset for r in records)),
        array("q", (_ms(r) for r in records)) if stamped else None,
        [r.value if r.HasField("value") else None for r in records],
        [r.key if r.HasField("key") else None for r in records],
        [[(h.key, h.value) for h in r.headers] or None for r in records],
    )


def _ms(record: common_pb2.Record) -> int:
    if not record.HasField("timestamp"):
        return NO_TIMESTAMP
    return record.timestamp.seconds * 1000 + record.timestamp.nanos // 1_000_000


# ---- delivery ----------------------------------------------------------------------------


@dataclass(slots=True)
class Slice:
    """Records [lo, hi) of a chunk, delivered under ``epoch`` for the ``deliveries``-th
    time; their values are ``chunk.values[vlo:vhi]``, their keys ``chunk.keys[klo:khi]``."""

    topic: str
    partition: int
    epoch: int
    chunk: Chunk
    lo: int
    hi: int
    vlo: int
    vhi: int
    klo: int
    khi: int
    deliveries: int = 1

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def first_offset(self) -> int:
        return self.chunk.offsets[self.lo]

    @property
    def last_offset(self) -> int:
        return self.chunk.offsets[self.hi - 1]

    @property
    def offsets(self) -> array[int]:
        return self.chunk.offsets[self.lo : self.hi]

    def data_bytes(self) -> int:
        """Key and value bytes of the slice."""
        return self.vhi - self.vlo + self.khi - self.klo

    def pieces(self, parts: Sequence[tuple[int, int, int]]) -> list[Slice]:
        """Sub-slices: for each (first, end, deliveries) of ``parts`` — record indexes
        relative to the slice, ascending and disjoint — the records [first, end), delivered
        for the ``deliveries``-th time."""
        chunk = self.chunk
        out = []
        k, vpos, kpos = self.lo, self.vlo, self.klo  # a record and where its bytes start

        def advance(to: int) -> None:
            nonlocal k, vpos, kpos
            vpos += sum(chunk.value_lengths[k:to])
            if chunk.key_lengths is not None:
                kpos += sum(chunk.key_lengths[k:to])
            k = to

        for first, end, deliveries in parts:
            advance(self.lo + first)
            lo, vlo, klo = k, vpos, kpos
            advance(self.lo + end)
            piece = Slice(
                self.topic, self.partition, self.epoch, chunk, lo, k, vlo, vpos, klo, kpos
            )
            piece.deliveries = deliveries
            out.append(piece)
        return out

    def to_batch(self) -> stream_pb2.RecordBatch:
        """The slice as a RecordBatch message (delivery writes its wire bytes directly,
        ``wire.record_batch``; this is for headers, and for tests)."""
        batch = stream_pb2.RecordBatch()
        chunk, lo, hi = self.chunk, self.lo, self.hi
        batch.topic = self.topic
        batch.partition = self.partition
        batch.lease_epoch = self.epoch
        batch.delivery_count = self.deliveries
        batch.offsets = packed(chunk.offsets[lo:hi])
        batch.values = chunk.values[self.vlo : self.vhi]
        batch.value_lengths = packed(lengths_column(chunk.value_lengths, lo, hi, chunk.value_nulls))
        if chunk.timestamps is not None:
            batch.timestamps = packed(chunk.timestamps[lo:hi])
        if chunk.key_lengths is not None:
            batch.keys = chunk.keys[self.klo : self.khi]
            batch.key_lengths = packed(lengths_column(chunk.key_lengths, lo, hi, chunk.key_nulls))
        if chunk.headers:
            for k in sorted(k for k in chunk.headers if lo <= k < hi):
                entry = batch.headers.add(index=k - lo)
                for hkey, hvalue in chunk.headers[k]:
                    entry.headers.add(key=hkey, value=hvalue)
        return batch

    def to_records(self) -> list[common_pb2.Record]:
        """One Record message per record (DELIVERY_FORMAT_RECORDS)."""
        chunk = self.chunk
        out = []
        vpos, kpos = self.vlo, self.klo
        for k in range(self.lo, self.hi):
            record = common_pb2.Record(
                topic=self.topic,
                partition=self.partition,
                offset=chunk.offsets[k],
                lease_epoch=self.epoch,
                delivery_count=self.deliveries,
            )
            vlen = chunk.value_lengths[k]
            if k not in chunk.value_nulls:
                record.value = chunk.values[vpos : vpos + vlen]
            vpos += vlen
            if chunk.key_lengths is not None:
                klen = chunk.key_lengths[k]
                if k not in chunk.key_nulls:
                    record.key = chunk.keys[kpos : kpos + klen]
                kpos += klen
            if chunk.timestamps is not None and (ms := chunk.timestamps[k]) >= 0:
                record.timestamp.CopyFrom(
                    timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)
                )
            for hkey, hvalue in (chunk.headers or {}).get(k, ()):
                record.headers.add(key=hkey, value=hvalue)
            out.append(record)
        return out


def lengths_column(lengths: array[int], lo: int, hi: int, nulls: frozenset[int]) -> array[int]:
    """Lengths of records [lo, hi), a null as NULL_LENGTH."""
    out = lengths[lo:hi]
    for k in nulls:
        if lo <= k < hi:
            out[k - lo] = NULL_LENGTH
    return out


def packed(column: array[int]) -> bytes:
    """A column as little-endian wire bytes."""
    if _BIG_ENDIAN:
        column = array(column.typecode, column)
        column.byteswap()
    return column.tobytes()


# ---- reading on the client ---------------------------------------------------------------


def _unpacked(typecode: str, data: bytes) -> list[int]:
    column = array(typecode)
    if len(data) % column.itemsize:
        raise ValueError(f"a packed column of {len(data)} bytes is not {typecode!r} elements")
    column.frombytes(data)
    if _BIG_ENDIAN:
        column.byteswap()
    return column.tolist()


class Columns:
    """One RecordBatch decoded into columns (the cutting of keys and values done in bulk);
    its DsRecords are built as they are read (:meth:`records`, :meth:`record`).

    Records are tuple subclasses, which the cyclic garbage collector tracks: built all at
    once and held, 10,000 of them set off young collections whose survivors cascaded into
    full ones over the application's whole heap (a third of the client's time per record).
    Built while iterated, each is usually gone before the collector counts it."""

    __slots__ = (
        "delivery_count",
        "headers",
        "keys",
        "lease_epoch",
        "offsets",
        "partition",
        "timestamps",
        "topic",
        "values",
    )
    timestamps: list[int] | None
    headers: list[Headers | None] | None

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        lease_epoch: int,
        offsets: bytes,
        timestamps: bytes,
        value_lengths: bytes,
        values: Region,
        key_lengths: bytes,
        keys: Region,
        delivery_count: int = 1,
    ) -> None:
        """A RecordBatch's fields, its keys and values as regions of a buffer: of the
        received message itself when read from wire bytes (``wire.parse_batches``), so
        each key and value is cut from it once. A delivery count of 0 (a sidecar that
        predates it) reads as 1."""
        self.topic = topic
        self.partition = partition
        self.lease_epoch = lease_epoch
        self.delivery_count = max(1, delivery_count)
        self.offsets = _unpacked("q", offsets)
        n = len(self.offsets)
        self.values = _split(values, _unpacked("i", value_lengths), n)
        self.keys = _split(keys, _unpacked("i", key_lengths), n)
        self.timestamps = None
        if timestamps:
            self.timestamps = _unpacked("q", timestamps)
            if len(self.timestamps) != n:
                raise ValueError(f"{len(self.timestamps)} timestamps for {n} records")
        self.headers = None

    @classmethod
    def of(cls, batch: stream_pb2.RecordBatch) -> Columns:
        """A RecordBatch message's columns."""
        values, keys = batch.values, batch.keys
        columns = cls(
            topic=batch.topic,
            partition=batch.partition,
            lease_epoch=batch.lease_epoch,
            offsets=batch.offsets,
            timestamps=batch.timestamps,
            value_lengths=batch.value_lengths,
            values=(values, 0, len(values)),
            key_lengths=batch.key_lengths,
            keys=(keys, 0, len(keys)),
            delivery_count=batch.delivery_count,
        )
        if batch.headers:
            n = len(columns)
            headers: list[Headers | None] = [None] * n
            for entry in batch.headers:
                if not 0 <= entry.index < n:
                    raise ValueError(f"headers for record {entry.index} of {n}")
                headers[entry.index] = [(h.key, h.value) for h in entry.headers]
            columns.headers = headers
        return columns

    def __len__(self) -> int:
        return len(self.offsets)

    def records(self) -> Iterator[DsRecord]:
        n = len(self.offsets)
        columns = zip(
            repeat(self.topic, n),
            repeat(self.partition, n),
            self.offsets,
            self.keys,
            self.values,
            repeat(NO_TIMESTAMP, n) if self.timestamps is None else self.timestamps,
            repeat(None, n) if self.headers is None else self.headers,
            repeat(self.lease_epoch, n),
            repeat(self.delivery_count, n),
            strict=False,
        )
        return map(tuple.__new__, repeat(DsRecord, n), columns)

    def record(self, k: int) -> DsRecord:
        return DsRecord(
            self.topic,
            self.partition,
            self.offsets[k],
            self.keys[k],
            self.values[k],
            NO_TIMESTAMP if self.timestamps is None else self.timestamps[k],
            None if self.headers is None else self.headers[k],
            self.lease_epoch,
            self.delivery_count,
        )


def decode_batch(batch: stream_pb2.RecordBatch) -> list[DsRecord]:
    """A RecordBatch as a list of DsRecords."""
    return list(Columns.of(batch).records())


def _split(region: Region, lengths: list[int], n: int) -> list[bytes | None]:
    """The bytes ``data[lo:hi]`` of ``region`` = (data, lo, hi) cut at ``lengths`` (-1 =
    None); all None when there are no lengths."""
    if not lengths:
        return [None] * n
    if len(lengths) != n:
        raise ValueError(f"{len(lengths)} lengths for {n} records")
    data, lo, hi = region
    if sum(lengths) == hi - lo and min(lengths) >= 0:
        # Successive reads of a BytesIO over the data (which shares its buffer): C-level
        # throughout, about a third of the cost of slicing in a comprehension.
        reader = io.BytesIO(data)
        reader.seek(lo)
        return list(map(reader.read, lengths))
    out: list[bytes | None] = []
    position = lo
    for length in lengths:
        if length < 0:
            out.append(None)
            continue
        if position + length > hi:
            raise ValueError(f"lengths add up to more than the {hi - lo} bytes of data")
        out.append(data[position : position + length])
        position += length
    if position != hi:
        raise ValueError(f"lengths add up to {position - lo} bytes, the data holds {hi - lo}")
    return out


def from_record(record: common_pb2.Record) -> DsRecord:
    """A Record message (DELIVERY_FORMAT_RECORDS, from an older sidecar) as a DsRecord."""
    return DsRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key if record.HasField("key") else None,
        value=record.value if record.HasField("value") else None,
        timestamp_ms=_ms(record),
        headers=[(h.key, h.value) for h in record.headers] or None,
        lease_epoch=record.lease_epoch,
        delivery_count=max(1, record.delivery_count),
    )
