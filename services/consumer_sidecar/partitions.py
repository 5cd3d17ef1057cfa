"""The sidecar's view of the partitions it leases: epoch, local deadline, buffer, acks.

Shared by the Kafka fetch thread (appends records) and the asyncio side (delivers, acks,
commits), so every buffer operation holds :attr:`PartitionTable.lock`. The local lease
deadline is the fencing rule of ARCHITECTURE §3.1: past it, a partition is neither
delivered nor committed, whatever else happens.

A partition's buffer is a queue of column chunks (:mod:`services.records.batches`),
and delivery hands out slices of them: appending, taking and acking cost a few operations
per chunk or per range, not per record.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.stats import PartitionStats
from services.records.batches import RECORD_OVERHEAD_BYTES, Chunk, Slice
from services.runtime.topic_partition import TP

# kafka_group mode (ARCHITECTURE §5.6): Kafka's group coordinator owns the partitions and
# fences commits by generation, so there is no lease. Such partitions carry epoch 0 and a
# deadline that never passes. Finite on purpose: Status turns the deadline into a Duration.
UNLEASED_EPOCH = 0
NO_DEADLINE = 1e10  # monotonic seconds (~317 years)

__all__ = ["NO_DEADLINE", "RECORD_OVERHEAD_BYTES", "UNLEASED_EPOCH", "Partition"]


@dataclass
class Partition:
    tp: TP
    epoch: int
    deadline: float  # monotonic seconds; nothing is delivered or committed after it
    acks: PartitionAcks
    committed: int = -1  # the last offset committed to Kafka by this lease
    committed_version: int = 0  # acks.version at that commit (acked-above ranges included)
    buffer: deque[Chunk] = field(default_factory=deque)  # chunk.start: first undelivered
    buffered_bytes: int = 0
    buffered_records: int = 0
    revoking: bool = False
    paused: bool = False
    position: int = -1  # next offset the fetcher will append
    # False between the grant and the moment Kafka fetching is set up. The partition is
    # already held (heartbeats renew it) but nothing is delivered or committed yet.
    ready: bool = False
    # Set when the local lease deadline passed: nothing is delivered or committed and
    # fetching is paused, but the lease is still reported, so a renewal (e.g. by a
    # restarted assigner adopting it) resumes it; an ack that does not renew it drops it.
    suspended_at: float | None = None
    fetched_bytes: int = 0  # cumulative, for the bytes/s reported to the assigner
    high_watermark: int = -1  # from librdkafka statistics; -1 = not known yet
    lag: int = -1  # records behind the high watermark; -1 = not known yet
    _rate_mark: tuple[float, int] | None = None

    def take_rate(self, now: float) -> float:
        """Bytes/s fetched since the previous call (0.0 on the first)."""
        mark, self._rate_mark = self._rate_mark, (now, self.fetched_bytes)
        if mark is None or now <= mark[0]:
            return 0.0
        return (self.fetched_bytes - mark[1]) / (now - mark[0])

    def reported_lag(self) -> int:
        """Lag of the committed offset: what the group is behind, as Kafka tools see it."""
        if self.high_watermark >= 0 and self.committed >= 0:
            return max(0, self.high_watermark - self.committed)
        return self.lag

    def live(self, now: float) -> bool:
        return now < self.deadline


class PartitionTable:
    def __init__(self, buffer_max_bytes: int, clock: Callable[[], float]) -> None:
        self.lock = threading.Lock()
        self.partitions: dict[TP, Partition] = {}
        self.buffer_max_bytes = buffer_max_bytes
        self.buffered_bytes = 0
        self.clock = clock
        self._cursor = 0  # round-robin start for fair delivery across partitions
        # Set by the fetch thread while it holds consumption back on a full buffer (leased
        # mode; Fetcher._holding); ``on_room`` wakes it when a delivery made room below
        # ``hold_at`` (the cap less what librdkafka may hold prefetched meanwhile).
        self.holding = False
        self.hold_at = buffer_max_bytes
        self.on_room: Callable[[], None] = lambda: None

    def per_partition_cap(self, share: int = 1) -> int:
        """A partition's buffer cap: ``share`` times its fair share of the total."""
        fair = self.buffer_max_bytes // max(len(self.partitions), 1)
        return max(share * fair, 64 * 1024)

    def append(self, tp: TP, chunk: Chunk) -> bool:
        """Fetch thread: buffer a chunk of a held partition. False if not held any more."""
        with self.lock:
            part = self.partitions.get(tp)
            if part is None or part.revoking or not part.ready or part.suspended_at is not None:
                return False
            chunk.skip_below(part.position)  # a re-fetch after a seek: already buffered
            if chunk.start >= len(chunk):
                return True
            size = chunk.remaining_bytes()
            part.buffer.append(chunk)
            part.buffered_bytes += size
            part.buffered_records += len(chunk) - chunk.start
            part.fetched_bytes += size
            self.buffered_bytes += size
            part.position = chunk.offsets[-1] + 1
            return True

    def take(self, max_records: int, max_bytes: int) -> list[Slice]:
        """Delivery: up to the limits from live partitions, fairly, marked delivered. At
        least one record when any is buffered, whatever its size."""
        now = self.clock()
        out: list[Slice] = []
        with self.lock:
            parts = [
                p
                for p in self.partitions.values()
                if p.buffer and p.ready and not p.revoking and p.live(now)
            ]
            if not parts:
                return out
            start = self._cursor % len(parts)
            self._cursor += 1
            ordered = parts[start:] + parts[:start]
            budget = _Budget(max_records, max_bytes)
            # Take a fair share per partition per pass, repeating until limits are hit.
            while ordered and budget.open():
                share = max(1, budget.records // len(ordered))
                next_round = []
                for part in ordered:
                    self._take_from(part, min(share, budget.records), budget, out)
                    if part.buffer:
                        next_round.append(part)
                    if not budget.open():
                        break
                ordered = next_round
            room = out and self.buffered_bytes < self.hold_at
        if room:
            self.on_room()
        return out

    def _take_from(self, part: Partition, count: int, budget: _Budget, out: list[Slice]) -> None:
        """Up to ``count`` records of ``part`` within the byte budget (lock held)."""
        while count > 0 and part.buffer:
            chunk = part.buffer[0]
            n = chunk.fitting(count, budget.bytes)
            if n == 0:
                if not budget.first:
                    budget.bytes = 0  # the next record does not fit: this take is full
                    return
                n = 1  # one record always goes, whatever its size
            before = chunk.remaining_bytes()
            taken = chunk.take(n, part.tp.topic, part.tp.partition, part.epoch)
            if chunk.start == len(chunk):
                part.buffer.popleft()
            size = before - chunk.remaining_bytes()
            part.buffered_bytes -= size
            part.buffered_records -= n
            self.buffered_bytes -= size
            count -= n
            budget.spend(n, size)
            out.extend(self._deliver(part, taken))

    @staticmethod
    def _deliver(part: Partition, taken: Slice) -> list[Slice]:
        """Mark a slice's records delivered; the slices to send. Records a previous owner
        acked before a handoff are skipped (not delivered again)."""
        first, last = taken.first_offset, taken.last_offset
        acks = part.acks
        if not acks.preacked_within(first, last + 1):
            if last - first == len(taken) - 1:
                acks.delivered_run(first, last + 1)
            else:  # gaps (compaction, transaction markers)
                acks.delivered_offsets(taken.offsets)
            return [taken]
        keep = []
        for offset in taken.offsets:
            skipped = acks.skip_preacked(offset)
            if not skipped:
                acks.delivered(offset)
            keep.append(not skipped)
        return taken.split(keep)

    def ack(self, part: Partition, offset: int) -> bool:
        """Ack under the table lock: delivery (take) updates the same tracker."""
        with self.lock:
            return part.acks.ack(offset)

    def ack_range(self, part: Partition, lo: int, hi: int) -> bool:
        """Ack every delivered record of [lo, hi) under the table lock."""
        with self.lock:
            return part.acks.ack_range(lo, hi)

    def ack_slices(self, slices: list[Slice]) -> None:
        """auto_ack: the slices just delivered count as acked."""
        with self.lock:
            for s in slices:
                part = self.partitions.get(TP(s.topic, s.partition))
                if part is not None and part.epoch == s.epoch:
                    part.acks.ack_range(s.first_offset, s.last_offset + 1)

    def commit_view(self, part: Partition) -> tuple[int, tuple[tuple[int, int], ...], int]:
        """(commit point, acked ranges above it, acks version), read consistently."""
        with self.lock:
            ranges = tuple(part.acks.acked_above())
            return part.acks.commit_point, ranges, part.acks.version

    def drop_buffer(self, part: Partition) -> None:
        with self.lock:
            self.buffered_bytes -= part.buffered_bytes
            part.buffer.clear()
            part.buffered_bytes = 0
            part.buffered_records = 0

    def add(self, part: Partition) -> None:
        with self.lock:
            old = self.partitions.pop(part.tp, None)
            if old is not None:
                self.buffered_bytes -= old.buffered_bytes
            self.partitions[part.tp] = part

    def remove(self, tp: TP) -> Partition | None:
        with self.lock:
            part = self.partitions.pop(tp, None)
            if part is not None:
                self.buffered_bytes -= part.buffered_bytes
            return part

    def get(self, tp: TP) -> Partition | None:
        with self.lock:
            return self.partitions.get(tp)

    def apply_stats(self, stats: Mapping[TP, PartitionStats]) -> None:
        with self.lock:
            for tp, pstats in stats.items():
                part = self.partitions.get(tp)
                if part is not None:
                    part.high_watermark = pstats.high_watermark
                    part.lag = pstats.lag

    def snapshot(self) -> list[Partition]:
        with self.lock:
            return list(self.partitions.values())


@dataclass
class _Budget:
    """What one take may still hand out."""

    records: int
    bytes: int
    first: bool = True  # nothing taken yet

    def open(self) -> bool:
        return self.records > 0 and self.bytes > 0

    def spend(self, records: int, nbytes: int) -> None:
        self.records -= records
        self.bytes -= nbytes
        if records:
            self.first = False
