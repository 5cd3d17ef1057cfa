"""Lag history of every partition the leader serves (pure: no I/O, no clock).

The leader samples each group's committed and end offsets on a timer
(:class:`~services.assigner.ui.gather.LagSampler`) and adds them here. Per partition this
keeps a ring of the last ``points`` lag samples (the sparkline) and the windows Burrow's
rules need (:mod:`services.runtime.lag`: a window of distinct commits and the recent
high watermarks), so the status shown is the one the notifier's lag evaluator would give
for the same samples. A window is judged once it is ``min_complete`` full; before that a
partition with lag shows OK, as in Burrow.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.runtime.lag import CommitWindow, Status, WatermarkHistory, evaluate_partition
from services.runtime.topic_partition import TopicPartition

SPARK_POINTS = 60  # at the default 5 s sampling: the last five minutes
WINDOW_INTERVALS = 10  # Burrow's default window of commits
MIN_COMPLETE = 0.5  # judge a partition once half its window is filled


@dataclass
class _Partition:
    lag: deque[int]
    window: CommitWindow
    marks: WatermarkHistory = field(default_factory=WatermarkHistory)


class LagHistory:
    def __init__(
        self,
        points: int = SPARK_POINTS,
        intervals: int = WINDOW_INTERVALS,
        min_distance_ms: int = 0,
        min_complete: float = MIN_COMPLETE,
    ) -> None:
        self.points = points
        self.intervals = intervals
        self.min_distance_ms = min_distance_ms
        self.min_complete = min_complete
        self._groups: dict[str, dict[TopicPartition, _Partition]] = {}

    def add(
        self, group: str, tp: TopicPartition, committed: int, end: int, lag: int, now_s: float
    ) -> None:
        """One sample: the group's committed offset (-1 = none), the end offset and the
        lag in records (as DescribeGroup computes it: the log start counts when nothing
        is committed)."""
        parts = self._groups.setdefault(group, {})
        part = parts.get(tp)
        if part is None:
            part = parts[tp] = _Partition(
                deque(maxlen=self.points), CommitWindow(self.intervals, self.min_distance_ms)
            )
        part.lag.append(max(lag, 0))
        part.marks.add(now_s, end)
        if committed >= 0:
            latest = part.window.latest
            # Burrow stores commits, not polls: an unchanged offset is a new commit only
            # if nothing newer was committed (a stalled consumer re-commits the same).
            if latest is None or committed != latest.offset or part.lag[-1] > 0:
                part.window.add(committed, int(now_s * 1000), end)

    def trend(self, group: str, tp: TopicPartition) -> list[int]:
        part = self._groups.get(group, {}).get(tp)
        return list(part.lag) if part is not None else []

    def status(self, group: str, tp: TopicPartition, now_s: float) -> Status:
        """Burrow's partition status; NOTFOUND before the first sample with a commit."""
        part = self._groups.get(group, {}).get(tp)
        if part is None:
            return Status.NOTFOUND
        judged = evaluate_partition(
            tp.topic, tp.partition, part.window, part.marks, now_s, self.min_complete
        )
        return Status.NOTFOUND if judged is None else judged.status

    def forget(self, group: str) -> None:
        self._groups.pop(group, None)

    def retain(self, groups: set[str]) -> None:
        for name in set(self._groups) - groups:
            del self._groups[name]
