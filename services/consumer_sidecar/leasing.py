"""Grants, revokes, acks and commits of the sidecar's leases (the data-plane half of §3.1).

* Grant → fetch from the start offset (the group's committed offset by default).
* Revoke → stop delivering, wait for in-flight acks up to the drain timeout, commit
  synchronously, unassign, report the release with the committed offset.
* Commits are batched (every interval, or early after many acks), carry the epoch in their
  metadata, and are refused for a partition whose local lease deadline has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from confluent_kafka import KafkaError, KafkaException

from dataservice.sidecar.v1 import stream_pb2
from services.consumer_sidecar.acks import AckError, PartitionAcks
from services.consumer_sidecar.fetcher import CommitRequest, Fetcher
from services.consumer_sidecar.partitions import TP, Partition, PartitionTable
from services.runtime.kafka import is_retriable

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ReleasedLease:
    tp: TP
    epoch: int
    committed: int


class LeaseKeeper:
    def __init__(
        self,
        table: PartitionTable,
        fetcher: Fetcher,
        *,
        commit_interval: float,
        commit_max_acks: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self.fetcher = fetcher
        self.commit_interval = commit_interval
        self.commit_max_acks = commit_max_acks
        self.clock = clock
        self.released: list[ReleasedLease] = []
        self.on_release: Callable[[], None] = lambda: None
        self._acks_since_commit = 0
        self._commit_now = asyncio.Event()
        self._commit_lock = asyncio.Lock()

    # ---- grants and revokes -----------------------------------------------------------

    def grant(self, tp: TP, epoch: int, deadline: float) -> bool:
        """Hold the lease at once (heartbeats renew it from now on); fetching is set up by
        :meth:`start_fetching`. False for a duplicate grant re-sent after a re-attach."""
        existing = self.table.get(tp)
        if existing is not None and existing.epoch >= epoch:
            return False
        self.table.add(Partition(tp=tp, epoch=epoch, deadline=deadline, acks=PartitionAcks(-1)))
        return True

    async def start_fetching(self, grants: dict[TP, int]) -> None:
        """Assign a burst of granted partitions in one go, retrying retriable Kafka errors
        (a brand-new group's coordinator answers NOT_COORDINATOR for a moment)."""
        backoff = 0.1
        while True:
            pending = {tp: o for tp, o in grants.items() if self._still_granted(tp)}
            if not pending:
                return
            try:
                starts: dict[TP, int] = await self.fetcher.run(self.fetcher.assign, pending)
                break
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not (isinstance(error, KafkaError) and is_retriable(error)):
                    raise
                log.info("assign failed with a retriable error; retrying", error=str(error))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        orphans = []
        for tp, start in starts.items():
            part = self.table.get(tp)
            if part is None or part.revoking:
                orphans.append(tp)  # revoked or expired while Kafka was being set up
                continue
            with self.table.lock:
                part.acks = PartitionAcks(start)
                part.position = start
                part.committed = start
                part.ready = True
            log.info(
                "lease granted",
                topic=tp.topic,
                partition=tp.partition,
                epoch=part.epoch,
                start=start,
            )
        for tp in orphans:
            await self.fetcher.run(self.fetcher.unassign, tp)

    def _still_granted(self, tp: TP) -> bool:
        part = self.table.get(tp)
        return part is not None and not part.revoking and not part.ready

    async def revoke(self, tp: TP, epoch: int, drain_timeout: float) -> None:
        part = self.table.get(tp)
        if part is None or part.epoch != epoch:
            # Not held (already released, or an older epoch): confirm so the assigner moves on.
            self._release(ReleasedLease(tp, epoch, -1))
            return
        part.revoking = True
        self.table.drop_buffer(part)
        if not part.ready:
            # Revoked before fetching started: nothing delivered, nothing to commit.
            self.table.remove(tp)
            self._release(ReleasedLease(tp, epoch, -1))
            return
        deadline = min(self.clock() + drain_timeout, part.deadline)
        while part.acks.inflight and self.clock() < deadline:
            await asyncio.sleep(0.02)
        if part.acks.inflight:
            log.warning(
                "drain timeout: releasing with unacked records",
                topic=tp.topic,
                partition=tp.partition,
                unacked=part.acks.inflight,
            )
        committed = await self._commit_partition(part)
        await self.fetcher.run(self.fetcher.unassign, tp)
        self.table.remove(tp)
        log.info(
            "lease released",
            topic=tp.topic,
            partition=tp.partition,
            epoch=epoch,
            committed=committed,
        )
        self._release(ReleasedLease(tp, epoch, committed))

    async def release_all(self, drain_timeout: float) -> None:
        await asyncio.gather(
            *(self.revoke(p.tp, p.epoch, drain_timeout) for p in self.table.snapshot())
        )

    def _release(self, released: ReleasedLease) -> None:
        self.released.append(released)
        self.on_release()

    def take_released(self) -> list[ReleasedLease]:
        out, self.released = self.released, []
        return out

    def renew(self, tp: TP, epoch: int, deadline: float) -> None:
        part = self.table.get(tp)
        if part is not None and part.epoch == epoch and not part.revoking:
            part.deadline = max(part.deadline, deadline)

    async def drop_expired(self) -> None:
        """Partitions whose local deadline passed stop for good: unassign, drop buffers.
        No release is reported — the assigner frees the lease at its own (later) expiry."""
        now = self.clock()
        for part in self.table.snapshot():
            if not part.live(now) and not part.revoking:
                log.warning(
                    "lease expired locally: stopped delivering and committing",
                    topic=part.tp.topic,
                    partition=part.tp.partition,
                    epoch=part.epoch,
                )
                part.revoking = True
                self.table.remove(part.tp)
                if part.ready:
                    tp = part.tp
                    await self.fetcher.run(self.fetcher.unassign, tp)

    # ---- acks and commits -------------------------------------------------------------

    def ack(self, ack: stream_pb2.RecordAck) -> stream_pb2.RejectedAck | None:
        tp = TP(ack.topic, ack.partition)
        part = self.table.get(tp)
        if part is None:
            return stream_pb2.RejectedAck(
                ack=ack,
                reason=stream_pb2.REJECT_REASON_NOT_HELD,
                message=f"{tp.topic}[{tp.partition}] is not leased by this sidecar",
            )
        if ack.lease_epoch != part.epoch:
            return stream_pb2.RejectedAck(
                ack=ack,
                reason=stream_pb2.REJECT_REASON_STALE_EPOCH,
                message=f"epoch {ack.lease_epoch} is not the current epoch {part.epoch}",
            )
        try:
            part.acks.ack(ack.offset)
        except AckError as exc:
            return stream_pb2.RejectedAck(
                ack=ack, reason=stream_pb2.REJECT_REASON_NOT_DELIVERED, message=str(exc)
            )
        self._acks_since_commit += 1
        if self._acks_since_commit >= self.commit_max_acks:
            self._commit_now.set()
        return None

    async def commit_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._commit_now.wait(), self.commit_interval)
            self._commit_now.clear()
            self._acks_since_commit = 0
            try:
                await self.commit_all()
                await self.drop_expired()
            except Exception as exc:
                log.warning("commit failed; will retry", error=str(exc))

    async def commit_all(self) -> None:
        async with self._commit_lock:
            now = self.clock()
            requests = []
            parts = []
            for part in self.table.snapshot():
                point = part.acks.commit_point
                if part.ready and part.live(now) and not part.revoking and point > part.committed:
                    requests.append(CommitRequest(part.tp, point, part.epoch))
                    parts.append(part)
            if not requests:
                return
            await self.fetcher.run(self.fetcher.commit, requests)
            for part, request in zip(parts, requests, strict=True):
                part.committed = max(part.committed, request.offset)

    async def _commit_partition(self, part: Partition) -> int:
        async with self._commit_lock:
            point = part.acks.commit_point
            if part.ready and point > part.committed and part.live(self.clock()):
                request = CommitRequest(part.tp, point, part.epoch)
                await self.fetcher.run(self.fetcher.commit, [request])
                part.committed = point
            return part.committed
