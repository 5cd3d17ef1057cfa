"""Delivered records encoded straight to wire bytes, and read back without protobuf.

Properties: for whatever was consumed and however delivery sliced it, the bytes
:mod:`wire` writes are exactly protobuf's serialization of the same messages, and
:func:`wire.parse_batches` reads them back to the same records as protobuf parsing does
— or declines (``None``) for what it does not read (headers, Record messages), never
reading them wrong.
"""

from __future__ import annotations

from array import array

import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2
from dsclient.records import wire
from dsclient.records.batches import Columns, DsRecord, Slice
from services.consumer_sidecar.runs import runs_from_messages
from services.runtime.topic_partition import TP
from tests.support.record_tables import consumed, table_holding


def delivered(messages: list[Message], max_records: int, max_bytes: int) -> list[list[Slice]]:
    runs, _ = runs_from_messages(messages)
    table = table_holding(messages)
    for run in runs:
        assert table.append(TP(run.topic, run.partition), run.chunk)
    out = []
    while taken := table.take(max_records, max_bytes):
        out.append(taken)
    return out


def records(columns: list[Columns]) -> list[DsRecord]:
    return [r for c in columns for r in c.records()]


@settings(max_examples=100, deadline=None)
@given(consumed(), st.integers(1, 40), st.integers(1, 3000), st.integers(1, 2**31 - 1))
def test_encoded_bytes_are_protobufs_and_read_back_alike(
    case: tuple[list[Message], list[DsRecord]], max_records: int, max_bytes: int, again: int
) -> None:
    messages, _ = case
    for first in delivered(messages, max_records, max_bytes):
        # Every other slice as a redelivery: its delivery count travels too.
        taken = [s.pieces([(0, len(s), again)])[0] if i % 2 else s for i, s in enumerate(first)]
        expected = stream_pb2.FetchResponse(batches=[s.to_batch() for s in taken])
        data = wire.fetch_response(taken)
        assert data == expected.SerializeToString()
        stream = stream_pb2.StreamResponse(batch=stream_pb2.StreamBatch(batches=expected.batches))
        assert wire.stream_response(taken) == stream.SerializeToString()

        by_protobuf = [Columns.of(b) for b in stream_pb2.FetchResponse.FromString(data).batches]
        parsed = wire.parse_batches(data)
        streamed = wire.parse_stream_batch(wire.stream_response(taken))
        if any(b.headers for b in expected.batches):
            assert parsed is None and streamed is None  # headers: left to protobuf
        else:
            assert parsed is not None and streamed is not None
            assert records(parsed) == records(streamed) == records(by_protobuf)

        # Answers to earlier acks carried by the batch (answers_with_batches): the same
        # bytes as protobuf's, read back in place with the answers, or left to protobuf
        # by a reader that does not ask for them.
        results = [stream_pb2.StreamAckResult(acked_count=n) for n in (again % 7, 3)]
        stream.batch.ack_results.extend(results)
        answered = wire.stream_response(taken, [r.SerializeToString() for r in results])
        assert answered == stream.SerializeToString()
        answers: list[bytes] = []
        answers_of_fields: list[bytes] = []
        streamed = wire.parse_stream_batch(answered, answers)
        fields = wire.stream_batch_fields(answered, answers_of_fields)
        if not any(b.headers for b in expected.batches):
            assert streamed is not None and records(streamed) == records(by_protobuf)
            assert fields is not None and len(fields) == len(taken)
            assert [stream_pb2.StreamAckResult.FromString(a) for a in answers] == results
            assert answers_of_fields == answers
        assert wire.parse_stream_batch(answered) is None

        # What a Fetch response says of carried acks (FetchResponse.acks), even an empty
        # message: protobuf's bytes, read back in place beside the records.
        answer = stream_pb2.FetchAckAnswer(seq=again, result=results[0])
        for acks in (
            stream_pb2.FetchAckAnswers(applied_seq=again, answers=[answer]),
            stream_pb2.FetchAckAnswers(),
        ):
            with_acks = stream_pb2.FetchResponse(batches=expected.batches, acks=acks)
            fetched = wire.fetch_response(taken, acks.SerializeToString())
            assert fetched == with_acks.SerializeToString()
            answers = []
            parsed = wire.parse_batches(fetched, answers=answers)
            if not any(b.headers for b in expected.batches):
                assert parsed is not None and records(parsed) == records(by_protobuf)
                assert [stream_pb2.FetchAckAnswers.FromString(a) for a in answers] == [acks]
            assert wire.parse_batches(fetched) is None  # a reader not asking: protobuf's


def test_varints_match_protobuf_for_the_edges() -> None:
    for value in (1, 127, 128, 300, 2**31 - 1, 2**62, -1, -(2**31)):
        batch = stream_pb2.RecordBatch(lease_epoch=value)
        assert batch.SerializeToString() == b"\x18" + wire.varint(value)
        assert wire.parse_batches(b"\x12" + wire.varint(len(b := batch.SerializeToString())) + b)


def test_negative_partition_and_epoch_read_back() -> None:
    batch = stream_pb2.RecordBatch(topic="t", partition=-3, lease_epoch=-(2**40))
    data = stream_pb2.FetchResponse(batches=[batch]).SerializeToString()
    (columns,) = wire.parse_batches(data) or []
    assert (columns.topic, columns.partition, columns.lease_epoch) == ("t", -3, -(2**40))


def test_what_it_does_not_read_is_left_to_protobuf() -> None:
    records_format = stream_pb2.FetchResponse(records=[common_pb2.Record(topic="t", offset=1)])
    with_headers = stream_pb2.FetchResponse(
        batches=[stream_pb2.RecordBatch(headers=[stream_pb2.RecordBatchHeaders(index=0)])]
    )
    inner = b"\x0a\x01t" + b"\x60\x01"  # topic "t", then a varint field 12
    unknown = b"\x12" + bytes([len(inner)]) + inner
    for message in (records_format.SerializeToString(), with_headers.SerializeToString()):
        assert wire.parse_batches(message) is None
    assert wire.parse_batches(unknown) is None
    assert wire.parse_batches(b"") == []
    ack_result = stream_pb2.StreamResponse(ack_result=stream_pb2.StreamAckResult(acked_count=2))
    assert wire.parse_stream_batch(ack_result.SerializeToString()) is None


def test_a_region_of_a_larger_message_is_read_in_place() -> None:
    batch = stream_pb2.RecordBatch(
        topic="a",
        partition=2,
        lease_epoch=5,
        offsets=array("q", [7, 9]).tobytes(),
        value_lengths=array("i", [2, -1]).tobytes(),
        values=b"hi",
        key_lengths=array("i", [-1, 1]).tobytes(),
        keys=b"k",
    )
    inner = stream_pb2.StreamBatch(batches=[batch]).SerializeToString()
    outer = stream_pb2.StreamResponse(batch=stream_pb2.StreamBatch(batches=[batch]))
    data = outer.SerializeToString()
    start = len(data) - len(inner)
    (columns,) = wire.parse_batches(data, start) or []
    assert list(columns.records()) == [
        DsRecord("a", 2, 7, None, b"hi", -1, None, 5),
        DsRecord("a", 2, 9, b"k", None, -1, None, 5),
    ]


def test_truncated_bytes_are_refused() -> None:
    batch = stream_pb2.RecordBatch(
        topic="a", offsets=array("q", [1]).tobytes(), value_lengths=b"\x01\0\0\0", values=b"x"
    )
    data = stream_pb2.FetchResponse(batches=[batch]).SerializeToString()
    for cut in range(1, len(data)):
        with pytest.raises(ValueError):
            wire.parse_batches(data[:cut])
