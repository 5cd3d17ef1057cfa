"""The sidecar's view of the partitions it leases: epoch, local deadline, buffer, acks.

Shared by the Kafka fetch thread (appends records) and the asyncio side (delivers, acks,
commits), so every buffer operation holds :attr:`PartitionTable.lock`. The local lease
deadline is the fencing rule of ARCHITECTURE §3.1: past it, a partition is neither
delivered nor committed, whatever else happens.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from dataservice.common.v1 import common_pb2
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.commitmeta import ranges_of

if TYPE_CHECKING:
    from services.consumer_sidecar.stats import PartitionStats


class TP(NamedTuple):
    topic: str
    partition: int


# kafka_group mode (ARCHITECTURE §5.6): Kafka's group coordinator owns the partitions and
# fences commits by generation, so there is no lease. Such partitions carry epoch 0 and a
# deadline that never passes. Finite on purpose: Status turns the deadline into a Duration.
UNLEASED_EPOCH = 0
NO_DEADLINE = 1e10  # monotonic seconds (~317 years)

# Per-record bookkeeping overhead counted against the buffer cap, besides key and value.
RECORD_OVERHEAD_BYTES = 96


def record_size(record: common_pb2.Record) -> int:
    return len(record.key) + len(record.value) + RECORD_OVERHEAD_BYTES


@dataclass
class Partition:
    tp: TP
    epoch: int
    deadline: float  # monotonic seconds; nothing is delivered or committed after it
    acks: PartitionAcks
    committed: int = -1  # the last offset committed to Kafka by this lease
    committed_version: int = 0  # acks.version at that commit (acked-above ranges included)
    buffer: deque[common_pb2.Record] = field(default_factory=deque)
    buffered_bytes: int = 0
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

    def per_partition_cap(self) -> int:
        return max(self.buffer_max_bytes // max(len(self.partitions), 1), 64 * 1024)

    def append(self, tp: TP, records: list[common_pb2.Record]) -> bool:
        """Fetch thread: buffer records of a held partition. False if not held any more."""
        with self.lock:
            part = self.partitions.get(tp)
            if part is None or part.revoking or not part.ready or part.suspended_at is not None:
                return False
            for record in records:
                if record.offset < part.position:
                    continue  # a re-fetch after seek; already buffered
                record.lease_epoch = part.epoch
                size = record_size(record)
                part.buffer.append(record)
                part.buffered_bytes += size
                part.fetched_bytes += size
                self.buffered_bytes += size
                part.position = record.offset + 1
            return True

    def take(self, max_records: int, max_bytes: int) -> list[tuple[Partition, common_pb2.Record]]:
        """Delivery: pop up to the limits from live partitions, fairly, marking delivered."""
        now = self.clock()
        out: list[tuple[Partition, common_pb2.Record]] = []
        taken_bytes = 0
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
            # Take a fair share per partition per pass, repeating until limits are hit.
            while ordered and len(out) < max_records:
                share = max(1, (max_records - len(out)) // len(ordered))
                next_round = []
                for part in ordered:
                    for _ in range(share):
                        if not part.buffer or len(out) >= max_records:
                            break
                        size = record_size(part.buffer[0])
                        if out and taken_bytes + size > max_bytes:
                            return out
                        record = part.buffer.popleft()
                        part.buffered_bytes -= size
                        self.buffered_bytes -= size
                        if part.acks.skip_preacked(record.offset):
                            continue  # acked before a handoff: not delivered again
                        taken_bytes += size
                        part.acks.delivered(record.offset)
                        out.append((part, record))
                    if part.buffer:
                        next_round.append(part)
                ordered = next_round
        return out

    def ack(self, part: Partition, offset: int) -> bool:
        """Ack under the table lock: the fetch thread updates the same tracker when it
        skips records a previous owner acked (see PartitionAcks.skip_preacked)."""
        with self.lock:
            return part.acks.ack(offset)

    def commit_view(self, part: Partition) -> tuple[int, tuple[tuple[int, int], ...], int]:
        """(commit point, acked ranges above it, acks version), read consistently."""
        with self.lock:
            ranges = tuple(ranges_of(part.acks.acked_above()))
            return part.acks.commit_point, ranges, part.acks.version

    def drop_buffer(self, part: Partition) -> None:
        with self.lock:
            self.buffered_bytes -= part.buffered_bytes
            part.buffer.clear()
            part.buffered_bytes = 0

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
