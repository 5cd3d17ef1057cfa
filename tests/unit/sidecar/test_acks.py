"""Property tests of the ack tracker: the commit point is always the lowest un-acked offset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar.acks import AckError, PartitionAcks


@st.composite
def deliveries_and_acks(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    start = draw(st.integers(min_value=0, max_value=10_000))
    gaps = draw(st.lists(st.integers(min_value=1, max_value=3), min_size=0, max_size=80))
    offsets: list[int] = []
    current = start
    for gap in gaps:
        offsets.append(current)
        current += gap
    acked = draw(st.lists(st.sampled_from(offsets), unique=True) if offsets else st.just([]))
    return start, offsets, draw(st.permutations(acked))


@settings(max_examples=500, deadline=None)
@given(deliveries_and_acks())
def test_commit_point_is_lowest_unacked(case: tuple[int, list[int], list[int]]) -> None:
    start, offsets, acks = case
    tracker = PartitionAcks(start)
    for offset in offsets:
        tracker.delivered(offset)
    acked: set[int] = set()
    for offset in acks:
        tracker.ack(offset)
        acked.add(offset)
        unacked = [o for o in offsets if o not in acked]
        expected = unacked[0] if unacked else offsets[-1] + 1
        assert tracker.commit_point == expected
        assert tracker.unacked() == unacked
        assert tracker.inflight == len(unacked)


@settings(max_examples=500, deadline=None)
@given(deliveries_and_acks())
def test_duplicate_acks_are_harmless(case: tuple[int, list[int], list[int]]) -> None:
    start, offsets, acks = case
    tracker = PartitionAcks(start)
    for offset in offsets:
        tracker.delivered(offset)
    for offset in acks + acks:
        tracker.ack(offset)
    unacked = [o for o in offsets if o not in set(acks)]
    assert tracker.commit_point == (
        unacked[0] if unacked else (offsets[-1] + 1 if offsets else start)
    )


def test_nothing_delivered_commits_start() -> None:
    assert PartitionAcks(42).commit_point == 42


def test_ack_of_undelivered_offset_is_refused() -> None:
    tracker = PartitionAcks(10)
    tracker.delivered(10)
    with pytest.raises(AckError):
        tracker.ack(11)


def test_out_of_order_delivery_is_refused() -> None:
    tracker = PartitionAcks(10)
    tracker.delivered(12)
    with pytest.raises(AckError):
        tracker.delivered(11)


def test_ack_all_moves_to_next() -> None:
    tracker = PartitionAcks(0)
    for offset in range(5):
        tracker.delivered(offset)
    tracker.ack(3)
    tracker.ack_all()
    assert tracker.commit_point == 5
    assert tracker.inflight == 0
