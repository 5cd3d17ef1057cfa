"""Column chunks: consume() batches in, RecordBatch/Record messages out, DsRecords back.

Property: whatever the batch (several topics and partitions in runs, null keys and values,
headers, records with and without timestamps, errors mixed in) and however delivery slices
it (record and byte limits), the client reads back exactly the records that were consumed,
in offset order per partition, each stamped with its lease epoch — through the compact
RecordBatch as through one Record message per record.
"""

from __future__ import annotations

import random
from array import array

import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.sidecar.v1 import stream_pb2
from dsclient.records.batches import (
    HEADER_OVERHEAD_BYTES,
    RECORD_OVERHEAD_BYTES,
    DsRecord,
    Slice,
    chunk_from_records,
    chunk_of,
    decode_batch,
    from_record,
)
from services.consumer_sidecar.runs import runs_from_messages
from services.runtime.topic_partition import TP
from tests.support.record_tables import consumed, table_holding


def _header_bytes(headers: list[tuple[str, bytes]] | None) -> int:
    return sum(len(k) + len(v) + HEADER_OVERHEAD_BYTES for k, v in headers or ())


def by_partition(records: list[DsRecord]) -> dict[tuple[str, int], list[DsRecord]]:
    out: dict[tuple[str, int], list[DsRecord]] = {}
    for r in records:
        out.setdefault((r.topic, r.partition), []).append(r)
    return out


@settings(max_examples=100, deadline=None)
@given(consumed(), st.integers(1, 40), st.integers(1, 3000), st.booleans())
def test_what_is_consumed_is_what_the_client_reads(
    case: tuple[list[Message], list[DsRecord]], max_records: int, max_bytes: int, wire: bool
) -> None:
    messages, expected = case
    runs, errors = runs_from_messages(messages)
    assert len(errors) == sum(m.error() is not None for m in messages)
    table = table_holding(messages)
    for run in runs:
        assert table.append(TP(run.topic, run.partition), run.chunk)
    assert table.buffered_bytes == sum(
        len(r.key or b"") + len(r.value or b"") + _header_bytes(r.headers) + RECORD_OVERHEAD_BYTES
        for r in expected
    )
    got: list[DsRecord] = []
    while taken := table.take(max_records, max_bytes):
        assert sum(map(len, taken)) <= max_records
        data = sum(s.data_bytes() for s in taken) + RECORD_OVERHEAD_BYTES * sum(map(len, taken))
        data += sum(  # headers count in the budget (issue 37, finding 8)
            _header_bytes([(h.key, h.value) for h in r.headers])
            for s in taken
            for r in s.to_records()
        )
        assert data <= max_bytes or sum(map(len, taken)) == 1  # one record always goes
        for s in taken:
            batch = s.to_batch()
            if wire:
                batch = stream_pb2.RecordBatch.FromString(batch.SerializeToString())
            decoded = decode_batch(batch)
            assert decoded == [from_record(r) for r in s.to_records()]
            got.extend(decoded)
    assert table.buffered_bytes == 0
    assert by_partition(got) == by_partition(expected)
    for (topic, partition), records in by_partition(expected).items():
        part = table.get(TP(topic, partition))
        assert part is not None and part.acks.inflight == len(records)


def test_fixed_and_variable_sizes_and_nulls_split_alike() -> None:
    rng = random.Random(7)
    for sizes in ([5] * 50, [rng.randint(0, 9) for _ in range(50)], [0] * 10):
        values = [bytes([65 + i % 26]) * size for i, size in enumerate(sizes)]
        values[3] = None  # type: ignore[call-overload]
        msgs = [Message(topic="a", partition=1, offset=i, value=v) for i, v in enumerate(values)]
        (run,), _ = runs_from_messages(msgs)
        s = Slice("a", 1, 9, run.chunk, 0, len(values), 0, len(run.chunk.values), 0, 0)
        assert [r.value for r in decode_batch(s.to_batch())] == values


@pytest.mark.parametrize(
    ("keys", "key_lengths", "key_nulls"),
    [
        ([b"k0", b"k1", b"k2"], [2, 2, 2], set()),  # no nulls: nothing looked for
        ([b"k0", None, b""], [2, 0, 0], {1}),  # a null key takes no bytes, b"" is not null
        ([None, None, None], None, set()),  # a keyless producer's: no key column at all
    ],
)
def test_chunk_columns_with_and_without_nulls(
    keys: list[bytes | None], key_lengths: list[int] | None, key_nulls: set[int]
) -> None:
    for values, value_nulls in (([b"a", b"bb", b""], set()), ([None, b"bb", None], {0, 2})):
        chunk = chunk_of(array("q", [4, 5, 6]), None, values, keys, [None] * 3)
        assert chunk.values == b"".join(v or b"" for v in values)
        assert chunk.value_lengths.tolist() == [len(v or b"") for v in values]
        assert chunk.value_nulls == value_nulls
        assert chunk.keys == b"".join(k or b"" for k in keys)
        assert (chunk.key_lengths and chunk.key_lengths.tolist()) == key_lengths
        assert chunk.key_nulls == key_nulls
    nothing = chunk_of(array("q", [4, 5]), None, [None, None], [None, None], [None, None])
    assert (nothing.values, nothing.value_lengths.tolist()) == (b"", [0, 0])
    assert nothing.value_nulls == {0, 1}


def test_a_malformed_batch_is_refused() -> None:
    good = stream_pb2.RecordBatch(
        topic="a",
        offsets=array("q", [1, 2]).tobytes(),
        value_lengths=array("i", [1, 1]).tobytes(),
        values=b"xy",
    )
    assert [r.value for r in decode_batch(good)] == [b"x", b"y"]
    for broken in (
        stream_pb2.RecordBatch(offsets=good.offsets, value_lengths=good.value_lengths, values=b"x"),
        stream_pb2.RecordBatch(offsets=good.offsets[:7]),
        stream_pb2.RecordBatch(offsets=good.offsets, value_lengths=array("i", [1]).tobytes()),
        stream_pb2.RecordBatch(
            offsets=good.offsets, timestamps=array("q", [5]).tobytes(), values=b""
        ),
    ):
        with pytest.raises(ValueError):
            decode_batch(broken)


def test_record_messages_round_trip_through_a_chunk() -> None:
    messages = [
        Message(topic="b", partition=0, offset=5, key=b"k", value=None, timestamp=(1, 1700)),
        Message(
            topic="b", partition=0, offset=6, value=b"v", headers=[("h", b"1")], timestamp=(0, -1)
        ),
    ]
    (run,), _ = runs_from_messages(messages)
    whole = Slice("b", 0, 7, run.chunk, 0, 2, 0, 1, 0, 1)
    records = whole.to_records()
    again = chunk_from_records(records)
    assert list(again.offsets) == [5, 6]
    assert [from_record(r) for r in records] == [
        DsRecord("b", 0, 5, b"k", None, 1700, None, 7),
        DsRecord("b", 0, 6, None, b"v", -1, [("h", b"1")], 7),
    ]
