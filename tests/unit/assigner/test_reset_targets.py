"""Where an offset reset moves a partition: the strategies, and clamping into the log."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.assigner.offsets import NO_OFFSET, PartitionOffsets
from services.assigner.reset_targets import (
    Strategy,
    plan_resets,
    reset_offset,
    target_offset,
)
from services.runtime.topic_partition import TopicPartition

LOG = PartitionOffsets(committed=120, earliest=100, end=200)


def test_each_strategy_asks_for_what_kafka_consumer_groups_would() -> None:
    assert target_offset(Strategy.EARLIEST, 0, LOG) == 100
    assert target_offset(Strategy.LATEST, 0, LOG) == 200
    assert target_offset(Strategy.ABSOLUTE, 150, LOG) == 150
    assert target_offset(Strategy.SHIFT_BY, -15, LOG) == 105
    assert target_offset(Strategy.SHIFT_BY, 30, LOG) == 150
    assert target_offset(Strategy.TIMESTAMP, 1_700_000_000_000, LOG, found_by_time=170) == 170


def test_a_timestamp_after_every_record_means_the_end() -> None:
    assert target_offset(Strategy.TIMESTAMP, 1, LOG, found_by_time=-1) == 200
    assert target_offset(Strategy.TIMESTAMP, 1, LOG, found_by_time=None) == 200


def test_shift_without_a_committed_offset_starts_from_the_log_start() -> None:
    fresh = PartitionOffsets(committed=NO_OFFSET, earliest=40, end=90)
    assert target_offset(Strategy.SHIFT_BY, 10, fresh) == 50


def test_out_of_range_targets_are_clamped_and_say_so() -> None:
    tp = TopicPartition("t", 0)
    below, above, inside = plan_resets(
        Strategy.ABSOLUTE,
        {tp: 5, TopicPartition("t", 1): 900, TopicPartition("t", 2): 150},
        {tp: LOG, TopicPartition("t", 1): LOG, TopicPartition("t", 2): LOG},
    )
    assert (below.target, below.new, below.clamped, below.old) == (5, 100, True, 120)
    assert (above.target, above.new, above.clamped) == (900, 200, True)
    assert (inside.target, inside.new, inside.clamped) == (150, 150, False)


@st.composite
def logs(draw: st.DrawFn) -> PartitionOffsets:
    """A partition's log with a committed offset anywhere near it (or none)."""
    earliest = draw(st.integers(0, 10**12))
    end = earliest + draw(st.integers(0, 10**9))
    near = st.integers(max(0, earliest - 1000), end + 1000)
    return PartitionOffsets(draw(st.one_of(st.just(NO_OFFSET), near)), earliest, end)


@given(logs(), st.integers(-(10**13), 10**13))
def test_the_new_offset_is_always_in_the_log_and_the_nearest_to_the_target(
    log: PartitionOffsets, target: int
) -> None:
    new = reset_offset(target, log)
    assert log.earliest <= new <= log.end
    assert (new == target) == (log.earliest <= target <= log.end)
    if target < log.earliest:
        assert new == log.earliest
    if target > log.end:
        assert new == log.end


@given(logs(), st.sampled_from(list(Strategy)), st.integers(0, 10**13))
def test_every_strategy_lands_in_the_log(
    log: PartitionOffsets, strategy: Strategy, value: int
) -> None:
    tp = TopicPartition("t", 0)
    found = {tp: log.earliest + (value % (log.end - log.earliest + 1))}
    (reset,) = plan_resets(strategy, {tp: value}, {tp: log}, found)
    assert log.earliest <= reset.new <= log.end
    assert reset.old == log.committed
    assert reset.clamped == (reset.new != reset.target)
