"""What the stall watch (stall_watch.py) costs the fetch loop: on every turn the fetch thread
tells the table it is alive; without a stall that must not take the table's lock, which the
event loop's deliveries and acks contend for (issue 34: the cost per pod). A stall still
marks the Kafka-fenced leases unverified, under the lock."""

from __future__ import annotations

import threading
from types import TracebackType

from hypothesis import given
from hypothesis import strategies as st

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.consumer_sidecar.stall_watch import StallWatch
from services.runtime.topic_partition import TP


class CountingLock:
    """A lock that counts how often it was taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> bool:
        self._lock.acquire()
        self.taken += 1
        return True

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self._lock.release()


def table_with_a_kafka_fenced_lease(now: float) -> tuple[PartitionTable, Partition, CountingLock]:
    table = PartitionTable(1 << 20, lambda: now)
    part = Partition(TP("t", 0), epoch=1, deadline=float("inf"), acks=PartitionAcks(0))
    part.kafka_fenced = True
    table.add(part)
    lock = CountingLock()
    table.lock = lock  # type: ignore[assignment]
    table.stall.limit = 1.0
    return table, part, lock


def test_the_fetch_loop_turning_without_a_stall_never_takes_the_lock() -> None:
    table, part, lock = table_with_a_kafka_fenced_lease(0.0)
    now = 0.0
    table.alive(now)  # the first sight: no gap to measure yet (under the lock)
    lock.taken = 0
    for _ in range(1000):
        now += 0.2  # a fetch-loop turn every poll timeout
        table.alive(now)
    assert lock.taken == 0
    assert table.stall.alive_at == now and table.stall.stalls == 0
    assert part.unverified == 0


def test_a_stall_seen_by_the_fetch_loop_marks_the_lease_under_the_lock() -> None:
    stalled: list[tuple[float, int]] = []
    table, part, lock = table_with_a_kafka_fenced_lease(0.0)
    table.on_stalled = lambda gap, leases: stalled.append((gap, leases))
    table.alive(10.0)
    table.alive(18.5)  # SIGSTOPped for 8.5 s
    assert stalled == [(8.5, 1)]
    assert part.unverified == 1
    assert lock.taken >= 1
    taken = lock.taken
    table.alive(18.7)  # running again: no stall, no lock
    assert lock.taken == taken and table.stall.stalls == 1


def test_a_clock_read_a_moment_earlier_by_another_thread_does_not_move_time_back() -> None:
    table, _part, lock = table_with_a_kafka_fenced_lease(0.0)
    table.alive(10.0)
    table.alive(9.9)
    assert table.stall.alive_at == 10.0 and lock.taken <= 1


@given(
    st.floats(0.2, 10),
    st.lists(st.floats(-1, 30, allow_nan=False), min_size=1, max_size=30),
)
def test_the_lock_free_check_counts_the_same_stalls_as_the_locked_one(
    limit: float, steps: list[float]
) -> None:
    """``running`` first, ``seen`` only when it declines (what ``alive`` does) notices
    exactly the stalls ``seen`` alone notices, with the same gaps (negative steps: a clock
    read a moment earlier by the other thread)."""
    alone, both = StallWatch(limit=limit), StallWatch(limit=limit)
    now = 0.0
    for step in steps:
        now += step
        gap_alone = alone.seen(now)
        gap_both = None if both.running(now) else both.seen(now)
        assert gap_alone == gap_both
        assert alone.alive_at == both.alive_at
    assert alone.stalls == both.stalls
