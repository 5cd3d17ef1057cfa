"""How DsClient turns what an application acks into range acks (pure logic).

A whole Batch is acked by the ranges it was delivered in; any other collection of records
(a subset, several batches, a modified batch) by its runs of consecutive offsets per
partition and epoch — never a range that covers a record the application did not ack.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2
from dsclient import acker as acker_module
from dsclient.acker import Acker
from dsclient.batch import (
    Batch,
    Span,
    accepted_spans,
    counted,
    received,
    spans_of,
)
from dsclient.batch import joined as join_batches
from dsclient.columns import Release
from dsclient.records.batches import DsRecord


def record(partition: int, offset: int, epoch: int = 1) -> DsRecord:
    return DsRecord("t", partition, offset, None, b"v", -1, None, epoch)


def covered(spans: list) -> set[tuple[str, int, int, int]]:  # type: ignore[type-arg]
    return {
        (s.topic, s.partition, s.lease_epoch, o)
        for s in spans
        for o in range(s.from_offset, s.to_offset)
    }


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(1, 2)),
        unique_by=lambda t: (t[0], t[1]),
        max_size=80,
    )
)
def test_subset_acks_cover_exactly_the_acked_records(
    picked: list[tuple[int, int, int]],
) -> None:
    records = [record(p, o, e) for p, o, e in picked]
    spans = spans_of(records)
    acked = {(r.topic, r.partition, r.lease_epoch, r.offset) for r in records}
    assert covered(spans) == acked
    assert sum(s.count for s in spans) == len(records)


def test_a_whole_batch_is_acked_by_its_delivery_ranges() -> None:
    batch = stream_pb2.RecordBatch(
        topic="t",
        partition=2,
        lease_epoch=4,
        offsets=array("q", [10, 11, 13]).tobytes(),  # 12 is a compaction gap
        value_lengths=array("i", [1, 1, 1]).tobytes(),
        values=b"abc",
    )
    got = received(stream_pb2.FetchResponse(batches=[batch]))
    assert isinstance(got, Batch) and [r.value for r in got] == [b"a", b"b", b"c"]
    assert got[-1] == got[2] == DsRecord("t", 2, 13, None, b"c", -1, None, 4)
    assert got == list(got) and got[1:] == list(got)[1:]
    (span,) = spans_of(got)
    assert (span.from_offset, span.to_offset, span.count, span.lease_epoch) == (10, 14, 3, 4)
    some = list(got)[:-1]  # the application acks part of it: only that is acked
    assert [(s.from_offset, s.to_offset) for s in spans_of(some)] == [(10, 12)]


def test_records_from_an_older_sidecar_are_converted() -> None:
    response = stream_pb2.FetchResponse(
        records=[
            common_pb2.Record(topic="t", partition=0, offset=5, value=b"x", lease_epoch=2),
            common_pb2.Record(topic="t", partition=0, offset=6, key=b"k", lease_epoch=2),
        ]
    )
    got = received(response)
    assert got == [
        DsRecord("t", 0, 5, None, b"x", -1, None, 2),
        DsRecord("t", 0, 6, b"k", None, -1, None, 2),
    ]
    assert [(s.from_offset, s.to_offset) for s in spans_of(got)] == [(5, 7)]


def test_records_of_refused_ranges_are_not_counted() -> None:
    spans = spans_of([record(0, 1), record(0, 2), record(1, 7), record(1, 9)])
    refused = stream_pb2.RejectedRangeAck(
        ack=spans[1].range_ack(), reason=stream_pb2.REJECT_REASON_STALE_EPOCH
    )
    assert counted(spans, accepted_spans(spans, [])) == 4
    assert counted(spans, accepted_spans(spans, [refused])) == 3


def test_batches_that_arrived_together_are_handed_out_as_one() -> None:
    def part(partition: int, offsets: list[int]) -> Batch:
        batch = stream_pb2.RecordBatch(
            topic="t",
            partition=partition,
            lease_epoch=1,
            offsets=array("q", offsets).tobytes(),
            value_lengths=array("i", [1] * len(offsets)).tobytes(),
            values=b"v" * len(offsets),
        )
        return received(stream_pb2.StreamBatch(batches=[batch]))

    joined = join_batches([part(0, [1, 2]), part(1, [7]), part(0, [3])])
    assert [(r.partition, r.offset) for r in joined] == [(0, 1), (0, 2), (1, 7), (0, 3)]
    assert [(r.partition, r.offset) for r in (joined[0], joined[2], joined[3])] == [
        (0, 1),
        (1, 7),
        (0, 3),
    ]
    assert [(s.partition, s.from_offset, s.to_offset) for s in spans_of(joined)] == [
        (0, 1, 3),
        (1, 7, 8),
        (0, 3, 4),
    ]
    assert not Batch() and Batch() == []


def test_acks_queued_behind_a_slow_one_go_together_each_counted_on_its_own() -> None:
    sent: list[list[Span]] = []
    first_sent, release = threading.Event(), threading.Event()

    def send(spans: list[Span], releases: Sequence[Release] = ()) -> list[bool]:
        sent.append(spans)
        first_sent.set()
        release.wait(10)  # the first ack's commit takes a while
        return [s.partition != 2 for s in spans]  # partition 2's ranges are refused

    acker = Acker(send)
    first = acker.submit(spans_of([record(0, 1), record(0, 2)]))
    assert first_sent.wait(10)
    later = [
        acker.submit(spans_of([record(1, 5)])),
        acker.submit(spans_of([record(2, 7), record(2, 8), record(0, 3)])),
        acker.submit([]),
    ]
    release.set()
    acker.close()  # returns once every submitted ack has its answer

    assert [f.result() for f in (first, *later)] == [2, 1, 1, 0]
    # The three acks queued while the first was out went as one, in the order submitted.
    assert [[(s.partition, s.from_offset, s.to_offset) for s in spans] for spans in sent] == [
        [(0, 1, 3)],
        [(1, 5, 6), (2, 7, 9), (0, 3, 4)],
    ]


def test_a_failed_send_fails_every_ack_it_carried() -> None:
    def send(spans: list[Span], releases: Sequence[Release] = ()) -> list[bool]:
        raise RuntimeError("channel closed")

    acker = Acker(send)
    futures = [acker.submit(spans_of([record(0, n)])) for n in range(3)]
    acker.close()
    for future in futures:
        assert isinstance(future.exception(), RuntimeError)


def test_a_fetch_claims_the_acks_at_the_head_that_it_can_carry_and_the_rest_are_sent() -> None:
    sent: list[list[Span]] = []

    def send(spans: list[Span], releases: Sequence[Release] = ()) -> list[bool]:
        sent.append(spans)
        return [True] * len(spans)

    acker = Acker(send)
    acker.carry_wait = 30.0  # nothing is sent by the thread unless given back or closing
    futures = [acker.submit(spans_of([record(p, 1)])) for p in (0, 0, 1, 0)]
    claimed = acker.claim(lambda spans: all(s.partition == 0 for s in spans))
    assert [c.spans[0].partition for c in claimed] == [0, 0]  # stops at partition 1's
    Acker.resolve(claimed, [True, False])
    assert [f.result(1) for f in futures[:2]] == [1, 0]
    assert sent == []
    # A claimed ack given back (its fetch failed) is sent at once, ahead of the rest.
    again = acker.claim(lambda spans: True)
    acker.give_back(again[:1])
    assert futures[2].result(10) == 1
    assert [[s.partition for s in spans] for spans in sent] == [[1]]
    acker.give_back(again[1:])
    acker.close()
    assert futures[3].result(1) == 1


def test_acks_given_back_after_close_are_not_accepted() -> None:
    acker = Acker(lambda spans, releases=(): [True] * len(spans))
    acker.carry_wait = 30.0
    future = acker.submit(spans_of([record(0, 1)]))
    claimed = acker.claim(lambda spans: True)
    acker.close()
    acker.give_back(claimed)  # the thread is gone: the ack is not known to have landed
    assert future.result(1) == 0


def test_carried_acks_resolve_from_their_answer_or_go_by_ack_when_it_does_not_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(acker_module, "CARRIED_ANSWER_SECONDS", 0.2)
    sent: list[list[Span]] = []

    def send(spans: list[Span], releases: Sequence[Release] = ()) -> list[bool]:
        sent.append(spans)
        return [True] * len(spans)

    acker = Acker(send)
    acker.carry_wait = 30.0
    first, second = (acker.submit(spans_of([record(0, n)])) for n in (1, 2))
    acker.carried(("a", 1), acker.claim(lambda spans: spans[0].from_offset == 1))
    acker.carried(("a", 2), acker.claim(lambda spans: True))
    refused = stream_pb2.RejectedRangeAck(
        ack=spans_of([record(0, 1)])[0].range_ack(), reason=stream_pb2.REJECT_REASON_STALE_EPOCH
    )
    acker.answered(("a", 1), stream_pb2.StreamAckResult(rejected_ranges=[refused]))
    assert first.result(1) == 0
    assert second.result(10) == 1  # no answer in time: sent with Ack
    assert [[s.from_offset for s in spans] for spans in sent] == [[2]]
    acker.answered(("a", 2), stream_pb2.StreamAckResult(acked_count=1))  # late: left alone
    acker.close()


def test_a_big_batch_is_not_carried_and_goes_at_once() -> None:
    """At saturation a batch's ack is amortized over its records: a fetch does not carry it
    and the thread does not hold it back for one (a late ack holds the sidecar's reads)."""
    sent = threading.Event()

    def send(spans: list[Span], releases: Sequence[Release] = ()) -> list[bool]:
        sent.set()
        return [True] * len(spans)

    acker = Acker(send)
    acker.carry_wait = 30.0
    big = [record(0, n) for n in range(acker_module.CARRY_MAX_RECORDS + 1)]
    future = acker.submit(spans_of(big))
    assert acker.claim(lambda spans: True) == []
    assert sent.wait(5) and future.result(5) == len(big)
    acker.close()
