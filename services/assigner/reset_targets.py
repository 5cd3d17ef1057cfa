"""Where an offset reset moves each partition (pure; the rules of ``ResetOffsets``).

One function per question, no I/O and no clock: :func:`target_offset` is what the strategy
asks for, :func:`reset_offset` clamps it into the partition's log, and :func:`plan_resets`
does both for every partition of a reset. The rules, as ``kafka-consumer-groups
--reset-offsets`` has them:

* EARLIEST is the log start offset, LATEST the end offset (high watermark);
* TIMESTAMP is the first offset whose record timestamp is >= the value, as the broker's
  offsets-for-times answers it, or the end offset when no record is that recent;
* ABSOLUTE is the value; SHIFT_BY is the committed offset plus the value (negative
  rewinds). A partition with nothing committed shifts from its log start, the offset a
  sidecar would start it from;
* every target outside ``[log start, end]`` is clamped to the nearer bound, and the
  outcome says so: the new offset always names a record still in the log, or the end.

Guarantees (``tests/unit/assigner/test_reset_targets.py`` holds them as properties):
``earliest <= new <= end`` always; ``new == target`` exactly when the target was in range;
clamping never moves past the target (``new`` is the bound nearest to it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from services.assigner.offsets import NO_OFFSET, PartitionOffsets
from services.runtime.topic_partition import TopicPartition


class Strategy(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    ABSOLUTE = "absolute"
    SHIFT_BY = "shift_by"

    @property
    def takes_value(self) -> bool:
        """Whether the strategy reads a value (a timestamp, an offset, a shift)."""
        return self in (Strategy.TIMESTAMP, Strategy.ABSOLUTE, Strategy.SHIFT_BY)


@dataclass(frozen=True)
class PartitionReset:
    tp: TopicPartition
    old: int  # committed offset before the reset; NO_OFFSET (-1) = none
    target: int  # what the strategy asked for
    new: int  # target clamped into [earliest, end]

    @property
    def clamped(self) -> bool:
        return self.new != self.target


def target_offset(
    strategy: Strategy, value: int, offsets: PartitionOffsets, found_by_time: int | None = None
) -> int:
    """The offset ``strategy`` asks for, before clamping. ``found_by_time`` is the broker's
    offsets-for-times answer for TIMESTAMP (None or < 0: no record that recent)."""
    if strategy is Strategy.EARLIEST:
        return offsets.earliest
    if strategy is Strategy.LATEST:
        return offsets.end
    if strategy is Strategy.TIMESTAMP:
        return found_by_time if found_by_time is not None and found_by_time >= 0 else offsets.end
    if strategy is Strategy.ABSOLUTE:
        return value
    base = offsets.committed if offsets.committed != NO_OFFSET else offsets.earliest
    return base + value


def reset_offset(target: int, offsets: PartitionOffsets) -> int:
    """``target`` clamped into the partition's log: [log start, end]."""
    return max(offsets.earliest, min(target, offsets.end))


def plan_resets(
    strategy: Strategy,
    values: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    found_by_time: Mapping[TopicPartition, int] | None = None,
) -> list[PartitionReset]:
    """The reset of every partition of ``values`` (its value per strategy), ordered by
    topic and partition. Every partition of ``values`` must be in ``offsets``."""
    found = found_by_time or {}
    out = []
    for tp in sorted(values):
        read = offsets[tp]
        target = target_offset(strategy, values[tp], read, found.get(tp))
        out.append(PartitionReset(tp, read.committed, target, reset_offset(target, read)))
    return out
