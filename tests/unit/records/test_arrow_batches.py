"""Arrow from packed columns (dsclient/records/arrow_batches.py): a delivery slice, and the
RecordBatch message it would be sent as, give exactly the rows ReadRange's ARROW_IPC chunks
give for the same Kafka messages (arrow_chunks, built message by message)."""

from __future__ import annotations

from array import array

import pyarrow as pa
import pyarrow.ipc as pa_ipc
from hypothesis import given, settings
from hypothesis import strategies as st

from dsclient.records import arrow_batches
from dsclient.records.batches import NO_TIMESTAMP, chunk_of
from services.consumer_sidecar import arrow_chunks
from tests.support.kafka_messages import Msg

payloads = st.one_of(st.none(), st.binary(max_size=64))
stamps = st.one_of(
    st.just((0, -1)),  # TIMESTAMP_NOT_AVAILABLE
    st.tuples(st.sampled_from([1, 2]), st.integers(0, 4_102_444_800_000)),
)
headers = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
    ),
)
rows = st.lists(st.tuples(payloads, payloads, stamps, headers), min_size=1, max_size=40)


def chunk_from(msgs: list[Msg]):  # type: ignore[no-untyped-def]
    """As the fetch thread builds a chunk (runs.py) from a partition run of messages."""
    stamped = array("q", [m.timestamp()[1] for m in msgs])
    return chunk_of(
        array("q", [m.offset() for m in msgs]),
        None if stamped.count(NO_TIMESTAMP) == len(msgs) else stamped,
        [m.value() for m in msgs],
        [m.key() for m in msgs],
        [m.headers() for m in msgs],
    )


@settings(max_examples=300, deadline=None)
@given(rows, st.data())
def test_a_slice_in_arrow_has_the_rows_readrange_gives(
    drawn: list[tuple], data: st.DataObject
) -> None:
    msgs = [Msg(100 + 2 * i, *row) for i, row in enumerate(drawn)]  # gaps: compaction
    chunk = chunk_from(msgs)
    lo = data.draw(st.integers(0, len(msgs) - 1), label="lo")
    hi = data.draw(st.integers(lo + 1, len(msgs)), label="hi")
    if lo:
        chunk.take(lo, "orders", 3, 7)  # delivered before: the slice starts mid-chunk
    piece = chunk.take(hi - lo, "orders", 3, 7)
    ipc = arrow_chunks.encode(msgs[lo:hi])  # type: ignore[arg-type]
    expected = pa_ipc.open_stream(ipc).read_all()
    got = arrow_batches.from_slice(piece)
    assert got.schema.equals(arrow_batches.SCHEMA)
    assert got.to_pylist() == expected.to_pylist()
    # The RecordBatch message the slice goes out as (DELIVERY_FORMAT_BATCHES) gives the
    # same rows on the client.
    assert arrow_batches.from_message(piece.to_batch()).to_pylist() == expected.to_pylist()


def test_key_and_value_columns_point_into_the_chunk_without_a_copy() -> None:
    msgs = [Msg(i, b"key%d" % i, b"v" * 100, (1, 5), None) for i in range(10)]
    chunk = chunk_from(msgs)
    piece = chunk.take(10, "orders", 3, 1)
    batch = arrow_batches.from_slice(piece)
    values = batch.column("value").buffers()[2]
    assert values.address == pa.py_buffer(chunk.values).address


def test_an_empty_batch_message_is_an_empty_record_batch() -> None:
    from dataservice.sidecar.v1 import stream_pb2

    got = arrow_batches.from_message(stream_pb2.RecordBatch(topic="t", partition=1))
    assert got.num_rows == 0
    assert got.schema.equals(arrow_batches.SCHEMA)
