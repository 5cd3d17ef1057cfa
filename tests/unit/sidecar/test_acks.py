"""Property tests of the ack tracker: the commit point is always the lowest un-acked offset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar.acks import NO_HOLDER, AckError, PartitionAcks


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


def test_passed_over_records_hold_the_commit_point_until_delivered_and_acked() -> None:
    """``key`` ordering's look-ahead (issue 39): 1 and 3 passed over, 2 and 4 delivered."""
    acks = PartitionAcks(0)
    acks.delivered_run(0, 1, 10.0, ("a", 1))
    acks.pass_over([1])
    acks.delivered_run(2, 3, 10.0, ("b", 1))
    acks.pass_over([3])
    acks.delivered_run(4, 5, 10.0, ("b", 1))
    assert (acks.passed, acks.inflight, acks.due) == (2, 3, 0)
    assert acks.unacked_runs() == [(0, 1, False), (2, 3, False), (4, 5, False)]
    assert acks.passed_runs() == [(1, 2), (3, 4)]
    acks.ack_range(0, 5)  # an ack range over passed-over records skips them
    assert acks.commit_point == 1 and acks.acked_above() == [(2, 2), (4, 4)]
    assert acks.expire(100.0, 1) == [] and acks.release(NO_HOLDER) == []
    assert acks.redeliver(0, 5) == [] and acks.holder_of(1) is None
    assert acks.deliver_passed(1, 2, 20.0, ("c", 1)) == 1
    assert acks.holder_of(1) == ("c", 1) and acks.deliveries_of(1) == 1
    acks.ack(1, "c")
    assert acks.commit_point == 3 and acks.passed == 1


def test_unpassed_records_are_due_with_no_delivery_counted_and_not_acked_by_a_range() -> None:
    acks = PartitionAcks(0)
    acks.delivered_run(0, 1, 10.0, ("a", 1))
    acks.pass_over([1, 2])
    acks.delivered_run(3, 4, 10.0, ("b", 1))
    assert acks.unpass() == 2
    assert (acks.passed, acks.due) == (0, 2) and acks.refetch_from() == 1
    acks.ack_range(0, 4)  # nobody received 1 and 2
    assert acks.commit_point == 1 and acks.due == 2
    assert acks.rewind() == 1
    assert acks.deliver([1, 2, 3], 20.0, ("c", 1)) == [(0, 2, 1)]  # a first delivery
    acks.ack_range(1, 3, "c")
    assert acks.commit_point == 4


def test_passing_over_reaches_past_records_a_previous_owner_acked() -> None:
    acks = PartitionAcks(0, preacked=[(2, 2)])
    acks.delivered_run(0, 1)
    acks.pass_over([1, 2, 3])
    assert acks.passed_runs() == [(1, 2), (3, 4)] and acks.next_offset == 4


def test_passing_over_out_of_order_is_refused() -> None:
    acks = PartitionAcks(0)
    acks.delivered_run(0, 2)
    with pytest.raises(AckError):
        acks.pass_over([1])
