"""ReadRange's ARROW_IPC chunks (services/consumer_sidecar/arrow_chunks.py): the same rows
the Spark source builds from the RECORDS format, within the size the chunker budgets, and
the chunker's offsets the same in both formats."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar import arrow_chunks
from services.consumer_sidecar.reader import RangeRead, RangeSpec, to_record
from services.runtime.topic_partition import TP
from spark.sources.arrow import BatchBuilder
from tests.support.kafka_messages import Eof, Msg

TOPIC = "orders"


payloads = st.one_of(st.none(), st.binary(max_size=64))
stamps = st.one_of(
    st.just((0, -1)),  # TIMESTAMP_NOT_AVAILABLE
    st.tuples(st.sampled_from([1, 2]), st.integers(0, 4_102_444_800_000)),  # create / append
)
headers = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
    ),
)
messages = st.lists(st.tuples(payloads, payloads, stamps, headers), min_size=1, max_size=30).map(
    lambda rows: [Msg(100 + i, *row) for i, row in enumerate(rows)]
)


@settings(max_examples=200, deadline=None)
@given(messages)
def test_arrow_chunks_give_spark_the_rows_records_give_and_stay_in_budget(msgs: list[Msg]) -> None:
    data = arrow_chunks.encode(msgs)
    builder = BatchBuilder(arrow_chunks.SCHEMA, "raw", "raw")
    from_arrow = builder.build_ipc(data, start=100)
    from_records = builder.build([to_record(m) for m in msgs])  # type: ignore[arg-type]
    assert from_arrow.to_pylist() == from_records.to_pylist()
    assert pa_ipc.open_stream(data).schema.equals(arrow_chunks.SCHEMA)
    # What the chunker budgets for the rows bounds the stream it gets.
    budget = sum(row_size(m) for m in msgs) + arrow_chunks.STREAM_OVERHEAD
    assert len(data) <= budget


def row_size(msg: Msg) -> int:
    return arrow_chunks.Columns(TOPIC, 3).add(msg)[0]  # type: ignore[arg-type]


def test_a_rows_size_counts_key_and_value_as_the_payload() -> None:
    msg = Msg(1, b"k" * 3, b"v" * 10, (1, 5), [("h", b"xy"), ("n", None)])
    columns = arrow_chunks.Columns(TOPIC, 3)
    size, payload = columns.add(msg)  # type: ignore[arg-type]
    assert payload == 13
    assert size == 13 + len(TOPIC) + arrow_chunks.ROW_OVERHEAD + 3 + 1 + 2 * 8
    assert (columns.keys, columns.offsets, columns.stamps, columns.headers) == (
        [b"kkk"],
        [1],
        [5000],
        [[{"key": "h", "value": b"xy"}, {"key": "n", "value": b""}]],
    )
    assert columns.pop() == 1 and len(columns) == 0 and not columns.keys


def test_one_chunk_holds_one_partition() -> None:
    with pytest.raises(ValueError, match="one partition"):
        arrow_chunks.encode(
            [Msg(1, None, b"a", (0, -1), None), Msg(2, None, b"b", (0, -1), None, partition=4)]
        )  # type: ignore[list-item]


class FakeConsumer:
    def __init__(self, batches: list[list[Msg | Eof]]) -> None:
        self.batches = batches

    def consume(self, num: int, timeout: float) -> list[Msg | Eof]:
        return self.batches.pop(0) if self.batches else []

    def close(self) -> None:
        pass


def _read(msgs: list[Msg], max_bytes: int, arrow: bool) -> list[tuple[list[int], int, int]]:
    spec = RangeSpec(TP(TOPIC, 3), 100, 100 + len(msgs), max_bytes, epoch=2, arrow=arrow)
    batches: list[list[Msg | Eof]] = [[*msgs[:7]], [*msgs[7:], Eof(100 + len(msgs))]]
    read = RangeRead(FakeConsumer(batches), spec, stall_timeout=1)  # type: ignore[arg-type]
    out = []
    while (chunk := read.next_chunk()) is not None:
        if arrow:
            assert not chunk.records and len(chunk.arrow_ipc) <= max_bytes
            table = pa_ipc.open_stream(pa.py_buffer(chunk.arrow_ipc)).read_all()
            offsets = table.column("offset").to_pylist()
        else:
            assert not chunk.arrow_ipc
            offsets = [r.offset for r in chunk.records]
            assert {r.lease_epoch for r in chunk.records} == {2}
        assert chunk.count == len(offsets)
        out.append((offsets, chunk.next_offset, chunk.payload_bytes))
    return out


def test_range_read_in_arrow_chunks_within_max_bytes() -> None:
    msgs = [Msg(100 + i, b"key", b"v" * 500, (1, 1_700_000_000_000 + i), None) for i in range(20)]
    # Room for the stream's overhead and three rows of 500 B.
    max_bytes = arrow_chunks.STREAM_OVERHEAD + 3 * row_size(msgs[0])
    chunks = _read(msgs, max_bytes, arrow=True)
    assert [offsets for offsets, _, _ in chunks] == [
        list(range(start, min(start + 3, 120))) for start in range(100, 120, 3)
    ]
    assert [nxt for _, nxt, _ in chunks] == [*range(103, 120, 3), 120]
    assert sum(payload for _, _, payload in chunks) == 20 * 503
    # The records format splits by its own sizes, and carries the same offsets overall.
    records = _read(msgs, max_bytes, arrow=False)
    assert [o for offsets, _, _ in records for o in offsets] == list(range(100, 120))
    assert sum(payload for _, _, payload in records) == 20 * 503


def test_a_row_larger_than_max_bytes_is_a_chunk_of_its_own() -> None:
    msgs = [Msg(100, None, b"v" * 9000, (0, -1), None), Msg(101, None, b"v", (0, -1), None)]
    spec = RangeSpec(TP(TOPIC, 3), 100, 102, 8192, epoch=2, arrow=True)
    read = RangeRead(FakeConsumer([[*msgs, Eof(102)]]), spec, stall_timeout=1)  # type: ignore[arg-type]
    first = read.next_chunk()
    second = read.next_chunk()
    assert first is not None and second is not None
    assert (first.count, first.next_offset, second.count, second.next_offset) == (1, 101, 1, 102)
    assert read.next_chunk() is None


@settings(max_examples=200, deadline=None)
@given(messages, st.integers(0, 4096), st.integers(0, 3))
def test_add_many_keeps_what_add_keeps_one_by_one(msgs: list[Msg], room: int, before: int) -> None:
    """Columns.add_many (the chunker's path) takes the same rows, sizes and cut as add
    message by message under the same budget, after ``before`` rows already kept."""
    head = [Msg(90 + i, b"k", b"v", (1, 5), None) for i in range(before)]
    one, many = arrow_chunks.Columns(TOPIC, 3), arrow_chunks.Columns(TOPIC, 3)
    for msg in head:
        one.add(msg)  # type: ignore[arg-type]
    many.add_many(head, 1 << 30)  # type: ignore[arg-type]
    size = payload = taken = 0
    for msg in msgs:
        msg_size, msg_payload = one.add(msg)  # type: ignore[arg-type]
        if len(one) > 1 and size + msg_size > room:
            one.pop()
            break
        size, payload, taken = size + msg_size, payload + msg_payload, taken + 1
    assert many.add_many(msgs, room) == (taken, size, payload)  # type: ignore[arg-type]
    assert (many.keys, many.values, many.offsets, many.stamps, many.headers) == (
        one.keys,
        one.values,
        one.offsets,
        one.stamps,
        one.headers,
    )
    assert many.encode() == one.encode()
