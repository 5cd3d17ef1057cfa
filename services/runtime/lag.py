"""Lag evaluation (pure): Burrow's rules over a sliding window of commits, time lag from
the high-watermark history, and the LAG_* faults they raise and resolve.

Burrow (linkedin/Burrow: wiki "Consumer Lag Evaluation Rules"; ``storage/inmemory.go``,
``evaluator/caching.go`` and the rule vectors of ``caching_test.go``, which
``tests/unit/notifier/test_lag.py`` replays), reproduced rule for rule:

* Window: the last ``intervals`` commits of each partition (default 10). A commit less
  than ``min_distance`` seconds after the newest stored one replaces it and keeps the
  stored timestamp. Each stored commit records the lag when it was seen: latest known
  high watermark - committed offset, floored at 0 (unknown when no high watermark was).
  The last ``intervals`` high watermarks polled are kept too ("broker offsets").
* Current lag: :func:`lag_records`, the records still in the log past the latest committed
  offset: high watermark - committed, counted from the log start when retention deleted
  records the group had not consumed (the one rule of every lag figure: ``dsctl lag``,
  DescribeGroup, ``/ui`` and ``ds_group_lag_records``).
* Partition status (``calculatePartitionStatus``), only when current lag > 0 and the
  window is at least ``min_complete`` full, else OK:
  STOP if now - newest commit > newest - oldest commit, unless a recent broker offset is
  <= the newest commit (the consumer was caught up moments ago); then, only if no commit
  in the window had zero lag: REWIND (an offset lower than the one before it), STALL
  (every offset equal), WARN (lag never decreases from one commit to the next).
* Group status: the worst partition status, where STOP, STALL and REWIND count as ERR.

Time lag (as kafka-lag-exporter does it): each partition keeps a history of (time, high
watermark) samples; the first unconsumed record (the committed offset ``c``) arrived when
the high watermark passed ``c``, found by linear interpolation between the samples around
it, or extrapolated from the history's average rate when it is older than the history.
Lag in seconds = now - that time; 0 when the group has consumed everything.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from dataservice.common.v1 import common_pb2


class Status(enum.IntEnum):
    """Burrow's status constants (same numbers), also the value of the status metrics."""

    NOTFOUND = 0
    OK = 1
    WARN = 2
    ERR = 3
    STOP = 4
    STALL = 5
    REWIND = 6


@dataclass(frozen=True)
class Commit:
    offset: int
    timestamp_ms: int
    lag: int | None  # None: no high watermark was known when the commit was seen


def partition_status(
    window: Sequence[Commit], broker_offsets: Sequence[int], current_lag: int, now_ms: int
) -> Status:
    """Burrow's ``calculatePartitionStatus`` for a window (oldest first)."""
    if not window or current_lag <= 0:
        return Status.OK
    if _stopped(window, now_ms) and not _recent_lag_zero(window, broker_offsets):
        return Status.STOP
    if all(c.lag is None or c.lag != 0 for c in window):
        if _rewound(window):
            return Status.REWIND
        if _stalled(window):
            return Status.STALL
        if _lag_not_decreasing(window):
            return Status.WARN
    return Status.OK


def _recent_lag_zero(window: Sequence[Commit], broker_offsets: Sequence[int]) -> bool:
    last = window[-1].offset
    return any(offset <= last for offset in broker_offsets)


def _rewound(window: Sequence[Commit]) -> bool:
    return any(b.offset < a.offset for a, b in itertools.pairwise(window))


def _stopped(window: Sequence[Commit], now_ms: int) -> bool:
    first, last = window[0].timestamp_ms, window[-1].timestamp_ms
    return (now_ms - last) > (last - first)


def _stalled(window: Sequence[Commit]) -> bool:
    return all(b.offset == a.offset for a, b in itertools.pairwise(window))


def _lag_not_decreasing(window: Sequence[Commit]) -> bool:
    lags = [c.lag for c in window if c.lag is not None]
    return all(b >= a for a, b in itertools.pairwise(lags))


def group_status(statuses: Iterable[Status]) -> Status:
    """Burrow: the worst partition status, with anything worse than ERR reported as ERR."""
    worst = Status.OK
    for status in statuses:
        worst = max(worst, min(status, Status.ERR))
    return worst


class CommitWindow:
    """One partition's sliding window of commits (Burrow's storage ring)."""

    def __init__(self, intervals: int, min_distance_ms: int) -> None:
        self.intervals = intervals
        self.min_distance_ms = min_distance_ms
        self._commits: deque[Commit] = deque(maxlen=intervals)

    def add(self, offset: int, timestamp_ms: int, high_watermark: int | None) -> None:
        timestamp = timestamp_ms
        if self._commits and timestamp_ms - self._commits[-1].timestamp_ms < self.min_distance_ms:
            # Faster than min-distance: overwrite the newest, keep its timestamp.
            timestamp = self._commits.pop().timestamp_ms
        lag = None if high_watermark is None else max(high_watermark - offset, 0)
        self._commits.append(Commit(offset, timestamp, lag))

    @property
    def commits(self) -> list[Commit]:
        return list(self._commits)

    @property
    def latest(self) -> Commit | None:
        return self._commits[-1] if self._commits else None

    @property
    def complete(self) -> float:
        """How full the window is (Burrow's ``complete``): 1.0 once it holds ``intervals``."""
        return len(self._commits) / self.intervals


def lag_records(committed: int, log_start: int, end: int) -> int:
    """Records not yet consumed: end - committed, or everything left in the log when
    nothing is committed (-1) or the commit points below the log start (deleted by
    retention: those records can no longer be consumed, so they are not lag)."""
    start = committed if committed >= 0 else log_start
    return max(0, end - max(start, log_start))


class WatermarkHistory:
    """(time, high watermark) samples of one partition, for time lag, and its log start
    offset as last polled."""

    def __init__(self, max_points: int = 360, recent: int = 10) -> None:
        self._points: deque[tuple[float, int]] = deque(maxlen=max_points)
        # The last polls as they came (Burrow's broker-offset ring, for "recent lag zero").
        self.recent: deque[int] = deque(maxlen=recent)
        # The first offset still in the log (0 until polled): retention moves it up.
        self.log_start = 0

    def add(self, time_s: float, offset: int) -> None:
        self.recent.append(offset)
        points = self._points
        if points and offset < points[-1][1]:
            points.clear()  # the log was truncated or recreated: start over
        # A flat run keeps its first and its last sample: records after the run arrived
        # after its end, records before it before its start.
        if len(points) >= 2 and points[-1][1] == offset and points[-2][1] == offset:
            points[-1] = (time_s, offset)
        else:
            points.append((time_s, offset))

    @property
    def latest(self) -> int | None:
        return self._points[-1][1] if self._points else None

    def __len__(self) -> int:
        return len(self._points)

    def arrival_time(self, offset: int) -> float | None:
        """When the record at ``offset`` was appended (the high watermark passed it);
        None if it has not been yet or the history is empty."""
        points = self._points
        if not points or offset >= points[-1][1]:
            return None
        target = offset + 1  # the high watermark once the record is in the log
        t0, h0 = points[0]
        if target <= h0:
            t_last, h_last = points[-1]
            if h_last > h0 and t_last > t0:
                rate = (h_last - h0) / (t_last - t0)
                return t0 - (h0 - target) / rate
            return t0  # no rate known: at least as old as the oldest sample
        for (ta, ha), (tb, hb) in zip(points, list(points)[1:], strict=False):
            if ha < target <= hb:
                return ta + (target - ha) / (hb - ha) * (tb - ta)
        return points[-1][0]  # unreachable: offset < latest high watermark


def time_lag(history: WatermarkHistory, committed: int, now_s: float) -> float:
    arrived = history.arrival_time(committed)
    return 0.0 if arrived is None else max(now_s - arrived, 0.0)


@dataclass(frozen=True)
class Thresholds:
    """Per-group lag thresholds; 0 disables one."""

    warn_records: int = 0
    error_records: int = 0
    warn_seconds: float = 0.0
    error_seconds: float = 0.0


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    status: Status
    lag_records: int
    lag_seconds: float
    complete: float
    committed: int
    high_watermark: int


@dataclass(frozen=True)
class GroupLag:
    group: str
    status: Status
    partitions: tuple[PartitionLag, ...]

    @property
    def total_lag(self) -> int:
        return sum(p.lag_records for p in self.partitions)

    @property
    def max_lag_seconds(self) -> float:
        return max((p.lag_seconds for p in self.partitions), default=0.0)


def evaluate_partition(
    topic: str,
    partition: int,
    window: CommitWindow,
    history: WatermarkHistory,
    now_s: float,
    min_complete: float = 0.0,
) -> PartitionLag | None:
    """Burrow's ``evaluatePartitionStatus``: OK until the window is ``min_complete`` full."""
    latest = window.latest
    high = history.latest
    if latest is None or high is None:
        return None
    current_lag = lag_records(latest.offset, history.log_start, high)
    status = Status.OK
    if window.complete >= min_complete:
        status = partition_status(
            window.commits, list(history.recent), current_lag, int(now_s * 1000)
        )
    return PartitionLag(
        topic=topic,
        partition=partition,
        status=status,
        lag_records=current_lag,
        lag_seconds=time_lag(history, max(latest.offset, history.log_start), now_s),
        complete=window.complete,
        committed=latest.offset,
        high_watermark=high,
    )


FaultTypeValue: TypeAlias = common_pb2.FaultType.ValueType
LAG_FAULTS: tuple[FaultTypeValue, ...] = (
    common_pb2.FAULT_TYPE_LAG_WARNING,
    common_pb2.FAULT_TYPE_LAG_ERROR,
    common_pb2.FAULT_TYPE_LAG_STALLED,
    common_pb2.FAULT_TYPE_LAG_STOPPED,
    common_pb2.FAULT_TYPE_LAG_REWOUND,
)
_STATUS_FAULTS: Mapping[Status, FaultTypeValue] = {
    Status.WARN: common_pb2.FAULT_TYPE_LAG_WARNING,
    Status.STALL: common_pb2.FAULT_TYPE_LAG_STALLED,
    Status.STOP: common_pb2.FAULT_TYPE_LAG_STOPPED,
    Status.REWIND: common_pb2.FAULT_TYPE_LAG_REWOUND,
}


@dataclass(frozen=True)
class Condition:
    """A LAG_* fault condition holding for some partitions of a group."""

    partitions: tuple[PartitionLag, ...]

    @property
    def topics(self) -> list[str]:
        return sorted({p.topic for p in self.partitions})


def _over(value: float, threshold: float) -> bool:
    return threshold > 0 and value >= threshold


def conditions(group: GroupLag, thresholds: Thresholds) -> dict[FaultTypeValue, Condition]:
    """Which LAG_* faults hold for the group now: one per Burrow partition status, and
    LAG_WARNING / LAG_ERROR past the group's thresholds."""
    hits: dict[FaultTypeValue, list[PartitionLag]] = {}
    for p in group.partitions:
        if p.status in _STATUS_FAULTS:
            hits.setdefault(_STATUS_FAULTS[p.status], []).append(p)
        error = _over(p.lag_records, thresholds.error_records) or _over(
            p.lag_seconds, thresholds.error_seconds
        )
        warn = _over(p.lag_records, thresholds.warn_records) or _over(
            p.lag_seconds, thresholds.warn_seconds
        )
        if error:
            hits.setdefault(common_pb2.FAULT_TYPE_LAG_ERROR, []).append(p)
        elif warn and p.status is not Status.WARN:
            hits.setdefault(common_pb2.FAULT_TYPE_LAG_WARNING, []).append(p)
    return {t: Condition(tuple(ps)) for t, ps in hits.items()}


@dataclass(frozen=True)
class Transition:
    group: str
    type: FaultTypeValue
    state: common_pb2.FaultState.ValueType
    condition: Condition


@dataclass
class LagFaultTracker:
    """Turns successive evaluations into OPEN / RESOLVED transitions per (group, type)."""

    open: dict[tuple[str, FaultTypeValue], Condition] = field(default_factory=dict)

    def update(self, group: str, now: Mapping[FaultTypeValue, Condition]) -> list[Transition]:
        out: list[Transition] = []
        for fault in LAG_FAULTS:
            key = (group, fault)
            held = self.open.get(key)
            current = now.get(fault)
            if current is not None and held is None:
                self.open[key] = current
                out.append(Transition(group, fault, common_pb2.FAULT_STATE_OPEN, current))
            elif current is None and held is not None:
                del self.open[key]
                out.append(Transition(group, fault, common_pb2.FAULT_STATE_RESOLVED, held))
            elif current is not None:
                self.open[key] = current
        return out

    def forget(self, group: str) -> list[Transition]:
        """The group is gone: resolve whatever it had open."""
        return self.update(group, {})
