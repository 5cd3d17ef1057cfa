"""A group's offsets on a partition and the lag they mean (pure).

Shared by DescribeGroup, ListGroups, the ``/ui`` pages and the lag sampler, so that every
view computes lag by the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.runtime.errors import DsError, Reason
from services.runtime.lag import lag_records
from services.runtime.topic_partition import TopicPartition

__all__ = ["NO_OFFSET", "Offsets", "PartitionOffsets", "lag_records", "lag_seconds", "total_lag"]

NO_OFFSET = -1


@dataclass(frozen=True)
class PartitionOffsets:
    committed: int  # the group's committed offset (next to consume); -1 = none
    earliest: int  # log start offset
    end: int  # high watermark
    # Who wrote the committed offset (commitmeta.committed_by); "" = nothing committed.
    committed_by: str = ""

    @property
    def lag(self) -> int:
        return lag_records(self.committed, self.earliest, self.end)


Offsets = dict[TopicPartition, PartitionOffsets]


def total_lag(offsets: Mapping[TopicPartition, PartitionOffsets]) -> int:
    return sum(o.lag for o in offsets.values())


def lag_seconds(lag: int, oldest_ms: int | None, now_wall: float) -> float:
    """Age of the oldest unconsumed record; 0 when caught up, -1 when unknown."""
    if lag == 0:
        return 0.0
    if oldest_ms is None:
        return -1.0
    return max(0.0, now_wall - oldest_ms / 1000.0)


def unavailable(message: str, group: str = "") -> DsError:
    """KAFKA_UNAVAILABLE for offsets Kafka did not give (in time)."""
    return DsError(Reason.KAFKA_UNAVAILABLE, message, metadata={"group": group} if group else None)
