"""The sidecar's side of column chunks: a consume() batch cut into per-partition runs,
and the partition table taking records from them (byte limits, records a previous owner
acked, a re-fetch after a seek), each delivery read back through the records codec.
"""

from __future__ import annotations

from confluent_kafka import Message
from hypothesis import given, settings

from dsclient.records.batches import RECORD_OVERHEAD_BYTES, DsRecord, decode_batch
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.runs import runs_from_messages
from services.runtime.topic_partition import TP
from tests.support.record_tables import consumed, table_holding


def test_a_byte_limit_cuts_inside_a_chunk_and_resumes_there() -> None:
    tp = TP("a", 0)
    messages = [
        Message(topic="a", partition=0, offset=o, value=b"v" * 10, timestamp=(1, 1000 + o))
        for o in range(10)
    ]
    table = table_holding(messages)
    (run,), _ = runs_from_messages(messages)
    table.append(tp, run.chunk)
    one = 10 + RECORD_OVERHEAD_BYTES
    first = table.take(100, 3 * one + 5)
    assert [list(s.offsets) for s in first] == [[0, 1, 2]]
    rest = table.take(100, 1 << 20)
    assert [list(s.offsets) for s in rest] == [list(range(3, 10))]
    assert [r.timestamp_ms for r in decode_batch(rest[0].to_batch())] == list(range(1003, 1010))


def test_records_a_previous_owner_acked_are_skipped_in_place() -> None:
    tp = TP("a", 0)
    messages = [Message(topic="a", partition=0, offset=o, value=b"%d" % o) for o in range(10)]
    table = table_holding(messages)
    part = table.get(tp)
    assert part is not None
    part.acks = PartitionAcks(0, preacked=[(2, 3), (7, 7)])
    (run,), _ = runs_from_messages(messages)
    table.append(tp, run.chunk)
    taken = table.take(100, 1 << 20)
    assert [list(s.offsets) for s in taken] == [[0, 1], [4, 5, 6], [8, 9]]
    values = [r.value for s in taken for r in decode_batch(s.to_batch())]
    assert values == [b"0", b"1", b"4", b"5", b"6", b"8", b"9"]
    assert part.acks.unacked() == [0, 1, 4, 5, 6, 8, 9]


def test_a_refetch_after_a_seek_is_not_buffered_twice() -> None:
    tp = TP("a", 0)
    messages = [Message(topic="a", partition=0, offset=o, value=b"x") for o in range(5)]
    table = table_holding(messages)
    (run,), _ = runs_from_messages(messages)
    assert table.append(tp, run.chunk)
    (again,), _ = runs_from_messages([*messages[2:], Message(topic="a", partition=0, offset=5)])
    assert table.append(tp, again.chunk)
    taken = table.take(100, 1 << 20)
    assert [o for s in taken for o in s.offsets] == [0, 1, 2, 3, 4, 5]
    assert decode_batch(taken[-1].to_batch())[-1].value is None


@settings(max_examples=25, deadline=None)
@given(consumed())
def test_a_consumer_of_one_topic_reads_no_topic_names(
    case: tuple[list[Message], list[DsRecord]],
) -> None:
    messages = [m for m in case[0] if m.error() is not None or m.topic() == "a"]
    looked_up, _ = runs_from_messages(messages)
    assumed, _ = runs_from_messages(messages, only_topic="a")
    assert [(r.topic, r.partition, list(r.chunk.offsets)) for r in assumed] == [
        (r.topic, r.partition, list(r.chunk.offsets)) for r in looked_up
    ]
