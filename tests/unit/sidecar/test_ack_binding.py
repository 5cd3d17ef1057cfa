"""Acks are bound to the client the records were delivered to (issue 18, item 4): another
client of the group may not ack a record in flight to someone else — before, any caller
that knew a partition's epoch could ack (and so commit past) records it never received.
A due record (deadline passed, holder gone, nacked) may be acked by anyone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.consumer_sidecar.acks import NO_HOLDER, NotHolderError, PartitionAcks
from tests.unit.sidecar.stream_harness import (
    GROUP,
    Sidecar,
    acks_of,
    fetch_request,
    range_ack,
    run,
)


def test_a_record_in_flight_to_one_client_is_not_acked_by_another() -> None:
    acks = PartitionAcks(0)
    acks.delivered_run(0, 5, due_at=100.0, holder=("a", 0))
    with pytest.raises(NotHolderError, match="offset 2 is in flight to another client"):
        acks.ack(2, "b")
    with pytest.raises(NotHolderError):
        acks.ack_range(0, 5, "b")
    assert acks.commit_point == 0  # nothing of the refused range applied
    assert acks.ack_range(0, 5, "a")
    assert acks.commit_point == 5


def test_a_due_record_may_be_acked_by_anyone() -> None:
    acks = PartitionAcks(0)
    acks.delivered_run(0, 3, due_at=10.0, holder=("a", 0))
    acks.expire(now=11.0)
    assert acks.is_due(1)
    assert acks.ack_range(0, 3, "b")
    assert acks.commit_point == 3


def test_without_a_holder_or_a_caller_the_check_does_not_apply() -> None:
    acks = PartitionAcks(0)
    acks.delivered_run(0, 2, holder=NO_HOLDER)
    acks.delivered_run(2, 4, holder=("a", 0))
    assert not acks.ack(3)  # internal acks (no caller), e.g. auto_ack
    assert acks.ack(0, "b")  # no holder recorded: anyone


@given(
    holders=st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=12),
    caller=st.sampled_from(["a", "b"]),
    lo=st.integers(0, 11),
    width=st.integers(1, 12),
)
def test_a_range_is_refused_whole_iff_it_covers_a_record_in_flight_to_another(
    holders: list[str], caller: str, lo: int, width: int
) -> None:
    acks = PartitionAcks(0)
    for offset, holder in enumerate(holders):
        acks.delivered_run(offset, offset + 1, due_at=100.0, holder=(holder, 0))
    hi = min(lo + width, len(holders))
    if hi <= lo:
        return
    before = acks.unacked()
    others = any(holders[o] != caller for o in range(lo, hi))
    if others:
        with pytest.raises(NotHolderError):
            acks.ack_range(lo, hi, caller)
        assert acks.unacked() == before
    else:
        acks.ack_range(lo, hi, caller)
        assert acks.unacked() == [o for o in before if not lo <= o < hi]


def test_on_the_servicer_another_client_is_refused_not_holder_and_the_holder_acks() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=3)
        sc.buffer(0, range(6))
        got = await stub.Fetch(fetch_request(client_id="a"))
        records = list(got.records)
        assert [r.offset for r in records] == list(range(6))
        intruder = await stub.Ack(
            stream_pb2.AckRequest(
                client_id="b",
                group=GROUP,
                acks=acks_of(records[:3]),
                ranges=[range_ack(0, 3, 6, 3)],
            )
        )
        assert intruder.acked_count == 0
        assert {r.reason for r in intruder.rejected_acks} == {stream_pb2.REJECT_REASON_NOT_HOLDER}
        assert [r.reason for r in intruder.rejected_ranges] == [stream_pb2.REJECT_REASON_NOT_HOLDER]
        assert not sc.fetcher.commits, "nothing committed for the intruder"
        owner = await stub.Ack(
            stream_pb2.AckRequest(client_id="a", group=GROUP, ranges=[range_ack(0, 0, 6, 3)])
        )
        assert owner.acked_count == 1 and not owner.rejected_ranges
        assert [(c.tp.partition, c.offset) for c in sc.fetcher.commits][-1] == (0, 6)

    run(body)
