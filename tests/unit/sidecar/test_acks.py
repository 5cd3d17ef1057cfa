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


# ---- range acks, delivered runs, preacked ranges -------------------------------------------


@st.composite
def range_acks(draw: st.DrawFn) -> tuple[int, list[int], list[tuple[int, int]]]:
    """Offsets delivered (with gaps) and ranges acked over them, in any order."""
    start, offsets, _ = draw(deliveries_and_acks())
    end = (offsets[-1] + 1) if offsets else start
    ranges = draw(
        st.lists(
            st.tuples(st.integers(start, end), st.integers(1, 12)).map(
                lambda t: (t[0], min(t[0] + t[1], end))
            ),
            max_size=30,
        )
    )
    return start, offsets, [(lo, hi) for lo, hi in ranges if hi > lo]


@settings(max_examples=300, deadline=None)
@given(range_acks())
def test_range_acks_commit_the_lowest_unacked_offset(
    case: tuple[int, list[int], list[tuple[int, int]]],
) -> None:
    start, offsets, ranges = case
    tracker = PartitionAcks(start)
    tracker.delivered_offsets(offsets)  # runs of consecutive offsets at once
    assert tracker.inflight == len(offsets)
    acked: set[int] = set()
    for lo, hi in ranges:
        tracker.ack_range(lo, hi)
        acked.update(o for o in offsets if lo <= o < hi)  # gaps in the range are ignored
        unacked = [o for o in offsets if o not in acked]
        expected = unacked[0] if unacked else (offsets[-1] + 1 if offsets else start)
        assert tracker.commit_point == expected
        assert tracker.unacked() == unacked
        assert tracker.inflight == len(unacked)
        # What a commit's metadata carries: no un-acked record, and every acked one above.
        above = {o for lo2, hi2 in tracker.acked_above() for o in range(lo2, hi2 + 1)}
        assert not above & set(unacked)
        assert {o for o in acked if o >= expected} <= above


def test_range_ack_past_the_last_delivered_offset_is_refused_whole() -> None:
    tracker = PartitionAcks(0)
    tracker.delivered_run(0, 10)
    with pytest.raises(AckError):
        tracker.ack_range(5, 11)
    assert tracker.inflight == 10 and tracker.commit_point == 0
    assert tracker.ack_range(0, 10)
    assert tracker.commit_point == 10 and tracker.inflight == 0
    assert not tracker.ack_range(0, 10)  # a duplicate is harmless


def test_delivered_runs_merge_and_out_of_order_is_refused() -> None:
    tracker = PartitionAcks(100)
    tracker.delivered_run(100, 200)
    tracker.delivered_run(200, 300)
    tracker.delivered_offsets([300, 301, 305])
    assert tracker.inflight == 203 and tracker.next_offset == 306
    with pytest.raises(AckError):
        tracker.delivered_run(250, 260)
    tracker.ack_range(150, 302)
    assert tracker.commit_point == 100
    assert tracker.acked_above() == [(150, 304)]  # acked, then the gap 302-304
    tracker.ack(305)
    assert tracker.acked_above() == [(150, 305)]


def test_preacked_ranges_are_skipped_and_count_as_acked() -> None:
    # A previous owner committed 10 with 12-14 and 20 acked above it.
    tracker = PartitionAcks(10, preacked=[(12, 14), (20, 20)])
    assert tracker.preacked_within(10, 12) is False
    assert tracker.preacked_within(11, 13) is True
    for offset in range(10, 22):
        if not tracker.skip_preacked(offset):
            tracker.delivered(offset)
    assert tracker.unacked() == [10, 11, 15, 16, 17, 18, 19, 21]
    tracker.ack_range(10, 12)
    assert tracker.commit_point == 15  # 12-14 were acked before the handoff
    tracker.ack_range(15, 20)
    assert tracker.commit_point == 21
    assert tracker.preacked_within(0, 1000) is False  # all behind delivery now
