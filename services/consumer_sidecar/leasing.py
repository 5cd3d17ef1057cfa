"""Grants, revokes and acks of the sidecar's leases (the data-plane half of §3.1).

* Grant → fetch from the start offset (the group's committed offset by default).
* Revoke → stop delivering, wait for in-flight acks up to the drain timeout, commit
  synchronously, unassign, report the release with the committed offset. A revoke for a
  configuration change (an offset reset: no drain; a mode switch) also *retires* the
  epoch: until the partition is granted again, an ack naming it is refused as stale (the
  records are delivered again from the new position), not as a partition held elsewhere.
* Acks and nacks are checked against the lease (:mod:`lease_checks`) and applied to the
  partition's tracker; the commits that make them durable are the committer's
  (:mod:`lease_commits`: batched commits, commit on ack, explicit commits, a revoke's
  final commit, external commits); the records that come due again are the redeliverer's
  (:mod:`redelivery`). The keeper makes both and hands them its lease checks.
* A lease whose local deadline passes is suspended (each commit round asks
  :meth:`LeaseKeeper.suspend_expired`): nothing of it is delivered or committed.
* ``commit_fencing: kafka`` (issue 36, :mod:`kafka_fenced_commits`): commits are fenced at
  the broker, so time is no longer needed for safety. A lease confirmed by the assigner
  has no local deadline (:data:`NO_DEADLINE`, as in kafka_group mode): it keeps being
  delivered and committed while no assigner is reachable, and ends only when an assigner
  revokes or fences it, or when Kafka refuses its commit because the next holder
  initialised the lease's transactional id (:meth:`LeaseKeeper.fenced_by_kafka`: dropped
  at once, nothing committed, reported released). Heartbeats and the TTL then only decide
  how fast the assigner notices a lost sidecar (failure detection). A sidecar that was
  itself away long enough for its leases to move (SIGSTOP, a frozen VM: stall_watch.py)
  delivers nothing of them until a commit made after it woke up has succeeded
  (:meth:`LeaseCommitter.commit_all` verifies them) or been fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from confluent_kafka import KafkaError, KafkaException

from dataservice.sidecar.v1 import stream_pb2
from services.consumer_sidecar.acks import AckError, PartitionAcks
from services.consumer_sidecar.events import LeaseEvents
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.kafka_fenced_commits import LeaseFenced
from services.consumer_sidecar.lease_checks import Problem, ack_error_reason, ack_problem
from services.consumer_sidecar.lease_commits import LeaseCommitter
from services.consumer_sidecar.offset_commits import OffsetCommitter
from services.consumer_sidecar.partitions import (
    NO_DEADLINE,
    Partition,
    PartitionTable,
)
from services.consumer_sidecar.redelivery import Redeliverer
from services.consumer_sidecar.round_timing import lost_latency
from services.runtime.kafka import is_retriable
from services.runtime.tasks import TaskSet
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)

# How long a retired epoch answers acks as stale after its release (then: not held).
RETIRED_EPOCH_SECONDS = 60.0


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
        commits: OffsetCommitter,
        *,
        commit_interval: float,
        commit_max_acks: int,
        commit_on_ack: bool = True,
        kafka_fenced: bool = False,
        clock: Callable[[], float] = time.monotonic,
        events: LeaseEvents | None = None,
    ) -> None:
        """``events``: what the keeper reports, and its commit path and redelivery."""
        self.table = table
        events = events or LeaseEvents()
        self._events = events
        # commit_fencing: kafka (module docstring): confirmed leases have no deadline. The
        # group's setting as of now: each lease takes it at its grant (Partition.kafka_fenced).
        self.kafka_fenced = kafka_fenced
        self.fetcher = fetcher
        self.clock = clock
        self.released: list[ReleasedLease] = []
        self.on_release: Callable[[], None] = lambda: None
        self._granted_at: dict[TP, float] = {}
        # Epochs given up for a configuration change: partition -> (epoch, when).
        self._retired: dict[TP, tuple[int, float]] = {}
        self._tasks = TaskSet("lease keeper task failed")
        # The commit path (lease_commits.py) and redelivery (redelivery.py) of these leases.
        self.committer = LeaseCommitter(
            table,
            commits,
            commit_interval=commit_interval,
            commit_max_acks=commit_max_acks,
            commit_on_ack=commit_on_ack,
            suspend_expired=self.suspend_expired,
            next_lease_deadline=self._next_lease_deadline,
            clock=clock,
            events=events.commits,
        )
        self.redeliverer = Redeliverer(
            table,
            fetcher,
            uncommitted=self.committer.uncommitted,
            spawn=self._tasks.spawn,
            clock=clock,
            events=events.redelivery,
        )

    # ---- grants and revokes -----------------------------------------------------------

    def grant(self, tp: TP, epoch: int, received_at: float) -> bool:
        """Hold the lease at once, not live yet: the first heartbeat ack that renews it
        gives it its deadline (:meth:`renew`; ARCHITECTURE §3.1.6). Fetching is set up by
        :meth:`start_fetching` meanwhile. False for a duplicate grant re-sent after a
        re-attach."""
        existing = self.table.get(tp)
        if existing is not None and existing.epoch >= epoch:
            return False
        self._retired.pop(tp, None)
        if existing is not None:
            # An older epoch still held here (a suspended lease granted back, or a re-grant
            # after a re-attach): it ends now; its Kafka assignment is replaced by assign().
            existing.revoking = True
        self.table.add(
            Partition(
                tp=tp,
                epoch=epoch,
                deadline=received_at,
                acks=PartitionAcks(-1),
                confirmed=False,
                granted_at=received_at,
                kafka_fenced=self.kafka_fenced,
            )
        )
        self._granted_at[tp] = self.clock()
        self._events.on_lease_change("grant")
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
            part = self.table.get(tp)  # made ready by the fetch thread (Fetcher.assign)
            if part is None or part.revoking:
                orphans.append(tp)  # revoked or expired while Kafka was being set up
                continue
            granted_at = self._granted_at.pop(tp, None)
            if granted_at is not None:
                self._events.on_lease_settled("grant", self.clock() - granted_at)
            log.info(
                "lease granted",
                topic=tp.topic,
                partition=tp.partition,
                epoch=part.epoch,
                start=start,
            )
        for tp in orphans:
            await self.fetcher.run(self.fetcher.unassign, tp)

    async def warm_up(self, topics: list[str]) -> None:
        """Before the first grants: :meth:`Fetcher.warm_up` on the fetch thread (the
        grants' assign queues behind it there, and finds it done)."""
        await self.fetcher.run(self.fetcher.warm_up, topics)

    def _still_granted(self, tp: TP) -> bool:
        part = self.table.get(tp)
        return part is not None and not part.revoking and not part.ready

    async def revoke(
        self, tp: TP, epoch: int, drain_timeout: float, *, retire: bool = False
    ) -> None:
        """Hand ``tp`` back (module docstring); ``retire`` for a configuration change."""
        if retire:
            self._retire(tp, epoch)
        part = self.table.get(tp)
        if part is None or part.epoch != epoch:
            # Not held (already released, or an older epoch): confirm so the assigner moves on.
            self._release(ReleasedLease(tp, epoch, -1))
            return
        part.revoking = True
        self._events.on_lease_change("revoke")
        revoked_at = self.clock()
        self._granted_at.pop(tp, None)
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
        committed = await self.committer.final_commit(part)
        if self.table.get(tp) is part:  # not superseded by a new grant meanwhile
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
        self._events.on_lease_settled("revoke", self.clock() - revoked_at)

    async def fence(self, tp: TP, epoch: int) -> None:
        """The assigner says this epoch is stale (the partition was granted elsewhere):
        stop at once, commit nothing, drop the buffer, and confirm the release."""
        part = self.table.get(tp)
        if part is not None and part.epoch <= epoch:
            part.revoking = True
            self._events.on_lease_change("revoke")
            self._granted_at.pop(tp, None)
            self.table.remove(tp)
            if part.ready:
                await self.fetcher.run(self.fetcher.unassign, tp)
            log.warning(
                "lease fenced: dropped without committing",
                topic=tp.topic,
                partition=tp.partition,
                epoch=epoch,
            )
        self._release(ReleasedLease(tp, epoch, -1))

    def fenced_by_kafka(self, fenced: LeaseFenced) -> None:
        """Kafka refused a commit of this lease for good (the next holder initialised its
        transactional id): it is over here. Dropped at once without committing and
        reported released; its acks are refused from now on (the records come again from
        the next holder). On the event loop (the app hands it over from the commit thread)."""
        log.warning(
            "lease fenced at Kafka: a newer holder took it; dropped without committing",
            topic=fenced.tp.topic,
            partition=fenced.tp.partition,
            epoch=fenced.epoch,
            error=str(fenced.error),
        )
        self._tasks.spawn(self.fence(fenced.tp, fenced.epoch))

    def _retire(self, tp: TP, epoch: int) -> None:
        now = self.clock()
        for old in [t for t, (_, at) in self._retired.items() if now - at > RETIRED_EPOCH_SECONDS]:
            del self._retired[old]
        self._retired[tp] = (max(epoch, self._retired.get(tp, (epoch, now))[0]), now)

    def retired_epoch(self, tp: TP) -> int | None:
        """The epoch ``tp`` was given up under for a configuration change, lately."""
        retired = self._retired.get(tp)
        if retired is None or self.clock() - retired[1] > RETIRED_EPOCH_SECONDS:
            return None
        return retired[0]

    async def drop_all(self) -> None:
        """The group switches to kafka_group: whatever leases are left here (lapsed on the
        assigner's side) are dropped without committing, like a fenced lease."""
        await asyncio.gather(*(self.fence(p.tp, p.epoch) for p in self.table.snapshot()))

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
        """A heartbeat ack renewed this lease: extend it (a fresh grant goes live now), and
        resume it if suspended (on the fetch thread, after the suspension's rewind: same
        thread, FIFO)."""
        part = self.table.get(tp)
        if part is None or part.epoch != epoch or part.revoking:
            return
        if part.kafka_fenced:
            deadline = NO_DEADLINE  # fenced at Kafka: the lease lasts until it is taken
        part.deadline = max(part.deadline, deadline)
        if not part.kafka_fenced:
            self.committer.wake_if_idle()  # a deadline to suspend the lease at
        if part.buffer:
            self._events.on_renewed()
        if not part.confirmed:
            part.confirmed = True
            log.debug("lease confirmed: live", topic=tp.topic, partition=tp.partition, epoch=epoch)
        if part.suspended_at is not None and part.live(self.clock()):
            log.info(
                "lease renewed: delivery resumes", topic=tp.topic, partition=tp.partition,
                epoch=epoch,
            )  # fmt: skip
            self._tasks.spawn(self.fetcher.run(self.fetcher.resume, tp))

    def not_renewed(
        self, renewed: set[tuple[TP, int]], sent_at: float, named: set[tuple[TP, int]]
    ) -> None:
        """A heartbeat was acked without renewing a lease that was suspended when it was
        sent, or a fresh grant it ``named``: the assigner no longer counts it as ours (the
        grant lapsed or moved on before it was confirmed). Drop it; nothing of it was
        delivered or committed since."""
        for part in self.table.snapshot():
            lease = (part.tp, part.epoch)
            stale = (part.suspended_at is not None and part.suspended_at <= sent_at) or (
                not part.confirmed and lease in named
            )
            if stale and lease not in renewed and not part.revoking:
                part.revoking = True
                self.table.remove(part.tp)
                log.warning(
                    "suspended lease not renewed by the assigner: dropped"
                    if part.confirmed
                    else "grant not confirmed by the assigner: dropped",
                    topic=part.tp.topic,
                    partition=part.tp.partition,
                    epoch=part.epoch,
                )
                self._tasks.spawn(self.fetcher.run(self.fetcher.unassign, part.tp))

    async def suspend_expired(self) -> None:
        """Fencing (ARCHITECTURE §3.1.4): once a lease's local deadline passes, nothing of
        it is delivered or committed (the flag stops both at once); its buffer is dropped
        and, on the fetch thread, fetching is paused and rewound."""
        now = self.clock()
        for part in self.table.snapshot():
            if (
                part.ready
                and part.confirmed  # a fresh grant has no deadline to pass yet
                and not part.revoking
                and part.suspended_at is None
                and not part.live(now)
            ):
                part.suspended_at = now
                self._events.on_lease_change("expire")
                self.table.drop_buffer(part)
                log.warning(
                    "lease expired locally: delivery and commits suspended",
                    topic=part.tp.topic,
                    partition=part.tp.partition,
                    epoch=part.epoch,
                )
                await self.fetcher.run(self.fetcher.suspend, part.tp)
                self._events.on_partition_lost(lost_latency(part.deadline, self.clock()))

    def _next_lease_deadline(self) -> float:
        """The earliest local deadline of a lease :meth:`suspend_expired` would suspend
        once it passed (inf: none)."""
        return min(
            (
                p.deadline
                for p in self.table.snapshot()
                if p.ready
                and p.confirmed
                and not p.revoking
                and p.suspended_at is None
                and p.deadline < NO_DEADLINE  # commit_fencing: kafka: none to watch
            ),
            default=math.inf,
        )

    # ---- nacks (what they give back comes due: the redeliverer's) ----------------------

    def nack_range(
        self, topic: str, partition: int, epoch: int, lo: int, hi: int, client: str, delay: float
    ) -> tuple[Problem | None, int]:
        """``client``'s records of [lo, hi) given back, to come again after ``delay``; why
        the nack is refused, or None, and how many records it concerned."""
        name = f"{topic}[{partition}]"
        tp = TP(topic, partition)
        part = self.table.get(tp)
        retired = self.retired_epoch(tp) if part is None else None
        problem = ack_problem(part, epoch, name, self.clock(), retired)
        if problem is not None or part is None:
            return problem, 0
        try:
            count, due = self.table.nack(part, lo, hi, client, delay)
        except AckError as exc:
            return (stream_pb2.REJECT_REASON_NOT_DELIVERED, str(exc)), 0
        self.redeliverer.after_due("nack", due)
        return None, count

    def nack_all(self, client: str, delay: float) -> int:
        """Every record of ``client`` in flight here given back; how many."""
        count, due = self.table.nack_all(client, delay)
        self.redeliverer.after_due("nack", due)
        return count

    # ---- acks ------------------------------------------------------------------------

    def ack(
        self, ack: stream_pb2.RecordAck, client: str | None = None
    ) -> stream_pb2.RejectedAck | None:
        reject = self._apply_ack(
            ack.topic, ack.partition, ack.lease_epoch,
            lambda part: self.table.ack(part, ack.offset, client),
        )  # fmt: skip
        if reject is None:
            return None
        return stream_pb2.RejectedAck(ack=ack, reason=reject[0], message=reject[1])

    def ack_range(
        self, ack: stream_pb2.RangeAck, client: str | None = None
    ) -> stream_pb2.RejectedRangeAck | None:
        """Every delivered record of [from_offset, to_offset) acked; checked like :meth:`ack`."""
        reject = self._apply_ack(
            ack.topic, ack.partition, ack.lease_epoch,
            lambda part: self.table.ack_range(part, ack.from_offset, ack.to_offset, client),
        )  # fmt: skip
        if reject is None:
            return None
        return stream_pb2.RejectedRangeAck(ack=ack, reason=reject[0], message=reject[1])

    def _apply_ack(
        self, topic: str, partition: int, epoch: int, apply: Callable[[Partition], object]
    ) -> Problem | None:
        """One ack (record or range): the lease checks, then ``apply`` on the partition's
        tracker; why it is refused, or None (counted towards the next commit)."""
        tp = TP(topic, partition)
        part = self.table.get(tp)
        retired = self.retired_epoch(tp) if part is None else None
        reject = ack_problem(part, epoch, f"{topic}[{partition}]", self.clock(), retired)
        if reject is None and part is not None:
            try:
                apply(part)
            except AckError as exc:
                reject = (ack_error_reason(exc), str(exc))
        if reject is not None:
            return reject
        self.committer.uncommitted(answered=True)  # every ack RPC commits before answering
        return None

    def holds(self, tp: TP, epoch: int) -> bool:
        """``tp`` is still held here under ``epoch`` (a revoke's drain included)."""
        part = self.table.get(tp)
        return part is not None and part.epoch == epoch

    def dead_lettered(self, tp: TP, epoch: int, lo: int, hi: int) -> None:
        """The parked records [lo, hi) are on the dead-letter topic (acked by Kafka): they
        count as acked, so the commit point may pass them. Nothing if the lease moved."""
        part = self.table.get(tp)
        if part is None or part.epoch != epoch:
            return
        with contextlib.suppress(AckError):  # committed past already (an explicit commit)
            self.table.ack_range(part, lo, hi, None)
            self.committer.uncommitted()
