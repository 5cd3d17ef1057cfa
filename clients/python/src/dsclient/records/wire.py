"""Delivered records straight to and from protobuf wire bytes (DELIVERY_FORMAT_BATCHES).

A ``RecordBatch`` is a handful of ``bytes`` fields: keys and values concatenated, and
packed columns. Building one as a protobuf message and then serializing it copies every
key and value twice (into the message, then into the wire bytes); for 1 KiB records that
was 8.5 ms of the serving thread's time per 10,000 records. :func:`fetch_response` and
:func:`stream_response` write the same bytes that ``SerializeToString`` gives, in one
copy, from the buffer's columns. On the client, :func:`parse_batches` reads a
``FetchResponse`` or ``StreamBatch`` without building the message: keys and values are
cut from the received bytes themselves (:class:`~dsclient.records.batches.Columns`), one
copy instead of three.

Only the shape the sidecar sends is read this way: anything else (a ``Record`` per record
from an older sidecar, headers, a field this code does not know) makes
:func:`parse_batches` return ``None`` and the caller parses the message as usual.

Pure code: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dsclient.records.batches import Columns, Slice, lengths_column, packed

_LEN = 2  # wire type of length-delimited fields
_VARINT = 0
_U64 = (1 << 64) - 1

# RecordBatch field numbers (protos/dataservice/sidecar/v1/stream.proto)
_TOPIC, _PARTITION, _EPOCH, _OFFSETS, _TIMESTAMPS = 1, 2, 3, 4, 5
_VALUE_LENGTHS, _VALUES, _KEY_LENGTHS, _KEYS = 6, 7, 8, 9
_DELIVERIES = 11
# FetchResponse.batches and StreamBatch.batches; StreamResponse.batch;
# StreamBatch.ack_results (answers to earlier acks, StreamOpen.answers_with_batches) and
# FetchResponse.acks (what it says of acks carried by fetches) share field number 4
_BATCHES = 2
_STREAM_BATCH = 1
_ACK_RESULTS = 4

Piece = bytes | memoryview
T = TypeVar("T")


def varint(value: int) -> bytes:
    """Protobuf base-128 varint; a negative value as its 64-bit two's complement."""
    value &= _U64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def _bytes_field(out: list[Piece], number: int, data: Piece) -> None:
    if len(data):  # proto3: an empty bytes or string field is not written
        out += (_tag(number, _LEN), varint(len(data)), data)


def _int_field(out: list[Piece], number: int, value: int) -> None:
    if value:
        out += (_tag(number, _VARINT), varint(value))


def record_batch(s: Slice) -> list[Piece]:
    """The pieces of one RecordBatch's encoding, as ``s.to_batch().SerializeToString()``
    (keys and values as views of the chunk: not copied until joined)."""
    chunk, lo, hi = s.chunk, s.lo, s.hi
    if chunk.headers and any(lo <= k < hi for k in chunk.headers):
        return [s.to_batch().SerializeToString()]  # rare: headers go through protobuf
    out: list[Piece] = []
    _bytes_field(out, _TOPIC, s.topic.encode())
    _int_field(out, _PARTITION, s.partition)
    _int_field(out, _EPOCH, s.epoch)
    _bytes_field(out, _OFFSETS, packed(chunk.offsets[lo:hi]))
    if chunk.timestamps is not None:
        _bytes_field(out, _TIMESTAMPS, packed(chunk.timestamps[lo:hi]))
    lengths = lengths_column(chunk.value_lengths, lo, hi, chunk.value_nulls)
    _bytes_field(out, _VALUE_LENGTHS, packed(lengths))
    _bytes_field(out, _VALUES, memoryview(chunk.values)[s.vlo : s.vhi])
    if chunk.key_lengths is not None:
        key_lengths = lengths_column(chunk.key_lengths, lo, hi, chunk.key_nulls)
        _bytes_field(out, _KEY_LENGTHS, packed(key_lengths))
        _bytes_field(out, _KEYS, memoryview(chunk.keys)[s.klo : s.khi])
    _int_field(out, _DELIVERIES, s.deliveries)  # after 9: protobuf writes fields in order
    return out


def _batches(slices: Sequence[Slice]) -> list[Piece]:
    out: list[Piece] = []
    for s in slices:
        pieces = record_batch(s)
        out += (_tag(_BATCHES, _LEN), varint(sum(map(len, pieces))), *pieces)
    return out


def fetch_response(slices: Sequence[Slice], answer: bytes | None = None) -> bytes:
    """A FetchResponse with one RecordBatch per slice, encoded, and ``answer`` (an encoded
    FetchAckAnswers, what it says of carried acks; None = nothing) as its ``acks``."""
    pieces = _batches(slices)
    if answer is not None:
        pieces += (_tag(_ACK_RESULTS, _LEN), varint(len(answer)), answer)
    return b"".join(pieces)


def stream_response(slices: Sequence[Slice], answers: Sequence[bytes] = ()) -> bytes:
    """A StreamResponse whose ``batch`` holds one RecordBatch per slice, encoded, and
    ``answers`` (encoded StreamAckResults) as its ``ack_results``."""
    pieces = _batches(slices)
    for answer in answers:
        pieces += (_tag(_ACK_RESULTS, _LEN), varint(len(answer)), answer)
    return b"".join([_tag(_STREAM_BATCH, _LEN), varint(sum(map(len, pieces))), *pieces])


# ---- reading ------------------------------------------------------------------------------


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def parse_batches(
    data: bytes, start: int = 0, end: int | None = None, answers: list[bytes] | None = None
) -> list[Columns] | None:
    """The RecordBatches of an encoded FetchResponse or StreamBatch (``data[start:end]``),
    as Columns whose keys and values are cut from ``data``; ``None`` when the message holds
    anything else (Record messages, headers, an unknown field): parse it with protobuf.
    With ``answers``, a FetchResponse's ``acks`` (encoded) is appended to it."""
    return _batches_of(data, start, len(data) if end is None else end, _record_batch, answers)


def _batches_of(
    data: bytes,
    start: int,
    end: int,
    build: Callable[[bytes, int, int], T | None],
    answers: list[bytes] | None = None,
) -> list[T] | None:
    """Each RecordBatch field of ``data[start:end]`` as ``build`` reads it; ``None`` when
    the message holds anything else or ``build`` gives up on one. With ``answers``, a
    StreamBatch's ``ack_results`` are read too: each encoded answer is appended to it."""
    out = []
    pos = start
    while pos < end:
        key, pos = _read_varint(data, pos, end)
        if key == _ACK_RESULTS << 3 | _LEN and answers is not None:
            size, pos = _read_varint(data, pos, end)
            if pos + size > end:
                raise ValueError("truncated StreamAckResult")
            answers.append(data[pos : pos + size])
            pos += size
            continue
        if key != _BATCHES << 3 | _LEN:
            return None
        size, pos = _read_varint(data, pos, end)
        if pos + size > end:
            raise ValueError("truncated RecordBatch")
        built = build(data, pos, pos + size)
        if built is None:
            return None
        out.append(built)
        pos += size
    return out


def parse_stream_batch(data: bytes, answers: list[bytes] | None = None) -> list[Columns] | None:
    """The RecordBatches of an encoded StreamResponse that holds a ``batch``, read as by
    :func:`parse_batches`; ``None`` for anything else (an ``ack_result``). With
    ``answers``, the batch's ``ack_results`` (encoded) are appended to it; without, a batch
    that carries any is left to protobuf."""
    bounds = _lone_batch(data)
    return None if bounds is None else _batches_of(data, *bounds, _record_batch, answers)


def _lone_batch(data: bytes) -> tuple[int, int] | None:
    """Where the StreamBatch of an encoded StreamResponse that holds only one lies."""
    if data[:1] != _tag(_STREAM_BATCH, _LEN):
        return None
    size, start = _read_varint(data, 1, len(data))
    if start + size != len(data):
        return None  # not a lone batch: let protobuf read it
    return start, start + size


@dataclass(frozen=True)
class BatchFields:
    """One RecordBatch of a received message, its columns as views of the message's bytes
    (nothing copied): what ``arrow_batches.record_batch`` takes."""

    topic: str
    partition: int
    lease_epoch: int
    delivery_count: int
    offsets: memoryview
    timestamps: memoryview
    value_lengths: memoryview
    values: memoryview
    key_lengths: memoryview
    keys: memoryview


def stream_batch_fields(
    data: bytes, answers: list[bytes] | None = None
) -> list[BatchFields] | None:
    """The RecordBatches of an encoded StreamResponse that holds a ``batch`` of
    RecordBatches only, as views of ``data``; ``None`` for anything else (an ack result,
    shared batches, headers, a field this reader does not know): parse it with protobuf.
    ``answers`` as in :func:`parse_stream_batch`."""
    bounds = _lone_batch(data)
    return None if bounds is None else _batches_of(data, *bounds, _batch_fields, answers)


def _batch_fields(data: bytes, pos: int, end: int) -> BatchFields | None:
    scanned = _scan(data, pos, end)
    if scanned is None:
        return None
    spans, ints = scanned
    view = memoryview(data)

    def field(number: int) -> memoryview:
        lo, hi = spans.get(number, (0, 0))
        return view[lo:hi]

    return BatchFields(
        topic=bytes(field(_TOPIC)).decode(),
        partition=_signed(ints[_PARTITION], 32),
        lease_epoch=_signed(ints[_EPOCH], 64),
        delivery_count=_signed(ints[_DELIVERIES], 32),
        offsets=field(_OFFSETS),
        timestamps=field(_TIMESTAMPS),
        value_lengths=field(_VALUE_LENGTHS),
        values=field(_VALUES),
        key_lengths=field(_KEY_LENGTHS),
        keys=field(_KEYS),
    )


def _scan(
    data: bytes, pos: int, end: int
) -> tuple[dict[int, tuple[int, int]], dict[int, int]] | None:
    """A RecordBatch's length-delimited fields (number → where) and varints (number →
    value); ``None`` on headers or a field this reader does not know."""
    spans: dict[int, tuple[int, int]] = {}
    ints = {_PARTITION: 0, _EPOCH: 0, _DELIVERIES: 0}
    while pos < end:
        key, pos = _read_varint(data, pos, end)
        number, wire_type = key >> 3, key & 7
        if number in ints and wire_type == _VARINT:
            ints[number], pos = _read_varint(data, pos, end)
        elif _TOPIC <= number <= _KEYS and wire_type == _LEN and number not in ints:
            size, pos = _read_varint(data, pos, end)
            if pos + size > end:
                raise ValueError("truncated field")
            spans[number] = (pos, pos + size)
            pos += size
        else:
            return None  # headers, or a field this reader does not know
    return spans, ints


def _record_batch(data: bytes, pos: int, end: int) -> Columns | None:
    scanned = _scan(data, pos, end)
    if scanned is None:
        return None
    spans, ints = scanned

    def field(number: int) -> bytes:
        lo, hi = spans.get(number, (0, 0))
        return data[lo:hi]

    return Columns(
        topic=field(_TOPIC).decode(),
        partition=_signed(ints[_PARTITION], 32),
        lease_epoch=_signed(ints[_EPOCH], 64),
        offsets=field(_OFFSETS),
        timestamps=field(_TIMESTAMPS),
        value_lengths=field(_VALUE_LENGTHS),
        values=(data, *spans.get(_VALUES, (0, 0))),
        key_lengths=field(_KEY_LENGTHS),
        keys=(data, *spans.get(_KEYS, (0, 0))),
        delivery_count=_signed(ints[_DELIVERIES], 32),
    )
