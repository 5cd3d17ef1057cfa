"""Grants, revokes, acks and commits of the sidecar's leases (the data-plane half of §3.1).

* Grant → fetch from the start offset (the group's committed offset by default).
* Revoke → stop delivering, wait for in-flight acks up to the drain timeout, commit
  synchronously, unassign, report the release with the committed offset. A revoke for a
  configuration change (an offset reset: no drain; a mode switch) also *retires* the
  epoch: until the partition is granted again, an ack naming it is refused as stale (the
  records are delivered again from the new position), not as a partition held elsewhere.
* Commits are batched (every interval, or early after many acks), carry the epoch in their
  metadata, and are refused for a partition whose local lease deadline has passed. An ack
  is answered accepted only once a commit covering it is durable in Kafka
  (:meth:`LeaseKeeper.commit_acked`); an ack that cannot be (the lease lapsed, the commit
  was dropped) is refused, and its records come again.
* A revoke's final commit that Kafka refuses is reported (COMMIT_FAILED) and retried while
  the lease lasts; then the partition is released with what *is* committed either way.
* Redelivery (ARCHITECTURE §3 "Delivery"): records in flight past the visibility timeout,
  nacked, or held by a stream that ended come due (:mod:`partitions`, :mod:`acks`); the
  keeper has the fetch thread re-read them and reports those given up past the delivery
  limit (POISON_RECORD).
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
  (:meth:`LeaseKeeper.commit_all` verifies them) or been fenced.
* Explicit commits (``CommitOffsets``, Spark's batch commit) are fenced the same way plus
  by the caller's lease epoch. They are authoritative when made: ``Partition.committed``
  becomes the committed offset, and the ack-driven committer only ever commits an ack
  point *above* ``Partition.committed``, so it never moves the group backwards behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException

from dataservice.sidecar.v1 import stream_pb2
from dsclient.reasons import DsError, Reason
from services.consumer_sidecar.acks import (
    AckError,
    GivenUp,
    Holder,
    NotHolderError,
    PartitionAcks,
)
from services.consumer_sidecar.fetcher import CommitRequest, Fetcher
from services.consumer_sidecar.idle_waits import commit_wait, redelivery_wait
from services.consumer_sidecar.kafka_fenced_commits import LeaseFenced
from services.consumer_sidecar.partitions import (
    NO_DEADLINE,
    UNLEASED_EPOCH,
    Due,
    Partition,
    PartitionTable,
    Reverted,
)
from services.consumer_sidecar.round_timing import lost_latency
from services.consumer_sidecar.wakeup import Wakeup
from services.runtime.kafka import is_retriable
from services.runtime.tasks import TaskSet
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)

# How long a retired epoch answers acks as stale after its release (then: not held).
RETIRED_EPOCH_SECONDS = 60.0
FINAL_COMMIT_BACKOFF = (0.1, 1.0)  # a revoke's failed final commit: retry from, up to
Problem = tuple[stream_pb2.RejectReason.ValueType, str]  # why an ack or nack is refused


@dataclass(frozen=True)
class ExplicitCommit:
    tp: TP
    offset: int
    epoch: int


@dataclass(frozen=True)
class CommitOutcome:
    commit: ExplicitCommit
    reason: stream_pb2.RejectReason.ValueType  # REJECT_REASON_UNSPECIFIED when committed
    message: str = ""

    @property
    def committed(self) -> bool:
        return self.reason == stream_pb2.REJECT_REASON_UNSPECIFIED


def lease_problem(
    part: Partition | None, now: float, epoch: int | None = None
) -> tuple[stream_pb2.RejectReason.ValueType, str] | None:
    """Why ``part`` may not be committed (or read) under ``epoch`` right now, as a
    (RejectReason, message); None if its lease is held, set up, live and at that epoch."""
    if part is None:
        return stream_pb2.REJECT_REASON_NOT_HELD, "not leased by this sidecar"
    if part.revoking:
        return stream_pb2.REJECT_REASON_NOT_HELD, "the lease is being handed off"
    if epoch is not None and epoch != part.epoch:
        return (
            stream_pb2.REJECT_REASON_STALE_EPOCH,
            f"epoch {epoch} is not the current epoch {part.epoch}",
        )
    if not part.ready or not part.confirmed:
        return stream_pb2.REJECT_REASON_NOT_HELD, "the lease was just granted; retry shortly"
    if not part.live(now) or part.suspended_at is not None:
        return stream_pb2.REJECT_REASON_LEASE_EXPIRED, "the local lease deadline passed"
    return None


def _ack_error_reason(exc: AckError) -> stream_pb2.RejectReason.ValueType:
    """The reject reason for an ack the partition's tracker refused."""
    if isinstance(exc, NotHolderError):
        return stream_pb2.REJECT_REASON_NOT_HOLDER
    return stream_pb2.REJECT_REASON_NOT_DELIVERED


def _ack_problem(
    part: Partition | None, epoch: int, name: str, now: float, retired: int | None = None
) -> Problem | None:
    """Why an ack (or nack) under ``epoch`` is refused, or None. A partition whose local
    lease deadline passed cannot commit, so its acks are refused too (the records come
    again from whoever holds it next); one being handed off still takes acks while its
    lease lasts (the revoke's drain waits for them). ``retired``: the epoch this sidecar
    gave ``name`` up under for a configuration change."""
    if part is None and retired is not None and epoch <= retired:
        return (
            stream_pb2.REJECT_REASON_STALE_EPOCH,
            f"epoch {epoch} of {name} was retired (offset reset or mode switch); its records "
            "come again from the new position",
        )
    if part is None:
        return stream_pb2.REJECT_REASON_NOT_HELD, f"{name} is not leased by this sidecar"
    if epoch != part.epoch:
        return (
            stream_pb2.REJECT_REASON_STALE_EPOCH,
            f"epoch {epoch} is not the current epoch {part.epoch}",
        )
    if not part.live(now) or part.suspended_at is not None:
        return (
            stream_pb2.REJECT_REASON_LEASE_EXPIRED,
            f"{name}: the local lease deadline passed; the records will be redelivered",
        )
    return None


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
        commit_on_ack: bool = True,
        kafka_fenced: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        # commit_fencing: kafka (module docstring): confirmed leases have no deadline. The
        # group's setting as of now: each lease takes it at its grant (Partition.kafka_fenced).
        self.kafka_fenced = kafka_fenced
        self.fetcher = fetcher
        self.commit_interval = commit_interval
        self.commit_max_acks = commit_max_acks
        self.commit_on_ack = commit_on_ack
        self.clock = clock
        self.released: list[ReleasedLease] = []
        self.on_release: Callable[[], None] = lambda: None
        # The outcome of each commit round (None = success): the sidecar's fault hook.
        self.on_commit: Callable[[BaseException | None], None] = lambda _error: None
        # Instrumentation hooks (metrics.py): a lease change by kind (grant, revoke,
        # expire), and how long a grant or revoke took to settle.
        self.on_lease_change: Callable[[str], None] = lambda _kind: None
        self.on_lease_settled: Callable[[str, float], None] = lambda _kind, _seconds: None
        # A lease expiry's latency: its local deadline until delivery was suspended.
        self.on_partition_lost: Callable[[float], None] = lambda _seconds: None
        # A renewal may make buffered records deliverable again (they were held back within
        # the delivery margin): wakes a long-polling Fetch or Stream (the data signal).
        self.on_renewed: Callable[[], None] = lambda: None
        # Redelivery: records that came due, by why (visibility_timeout, nack, stream_end,
        # not_sent); records given up past the delivery limit (the POISON_RECORD hook).
        self.on_redelivery: Callable[[str, int], None] = lambda _why, _records: None
        self.on_given_up: Callable[[TP, int, GivenUp], None] = lambda _tp, _epoch, _g: None
        # A given-up range parked for the dead-letter topic (dead_letter.py), with why it
        # last came due: the sidecar writes it there, then calls dead_lettered().
        self.on_dead_letter: Callable[[TP, int, GivenUp, str], None] = (
            lambda _tp, _epoch, _g, _why: None
        )
        # A commit this sidecar did not make was found on a held partition: report it now.
        self.on_external: Callable[[], None] = lambda: None
        self._granted_at: dict[TP, float] = {}
        # Epochs given up for a configuration change: partition -> (epoch, when).
        self._retired: dict[TP, tuple[int, float]] = {}
        self._acks_since_commit = 0
        self._commit_now = asyncio.Event()
        # Issue 34: the commit and redelivery loops sleep until a deadline they know of,
        # or with none until an ack (the commit loop is idle: ``_commits_idle``) or a
        # delivery (``table.on_in_flight``) gives them one.
        self._commits_idle = False
        self._in_flight = Wakeup()
        table.on_in_flight = self._in_flight.set
        self._commit_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # the commit loop's
        table.on_stalled = self._stalled
        self._tasks = TaskSet("lease keeper task failed")

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
        self.on_lease_change("grant")
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
                self.on_lease_settled("grant", self.clock() - granted_at)
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
        self.on_lease_change("revoke")
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
        committed = await self._final_commit(part)
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
        self.on_lease_settled("revoke", self.clock() - revoked_at)

    async def fence(self, tp: TP, epoch: int) -> None:
        """The assigner says this epoch is stale (the partition was granted elsewhere):
        stop at once, commit nothing, drop the buffer, and confirm the release."""
        part = self.table.get(tp)
        if part is not None and part.epoch <= epoch:
            part.revoking = True
            self.on_lease_change("revoke")
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
        if self._commits_idle and not part.kafka_fenced:
            self._commit_now.set()  # a deadline to suspend the lease at, should it lapse
        if part.buffer:
            self.on_renewed()
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
                self.on_lease_change("expire")
                self.table.drop_buffer(part)
                log.warning(
                    "lease expired locally: delivery and commits suspended",
                    topic=part.tp.topic,
                    partition=part.tp.partition,
                    epoch=part.epoch,
                )
                await self.fetcher.run(self.fetcher.suspend, part.tp)
                self.on_partition_lost(lost_latency(part.deadline, self.clock()))

    # ---- redelivery -------------------------------------------------------------------

    async def redelivery_loop(self) -> None:
        """Records whose ack deadline (the visibility timeout) passed come due: the loop
        sleeps until the earliest deadline of a record in flight (looking again at least
        every ``REDELIVERY_CHECK_SECONDS``), and with none in flight until a delivery."""
        self._in_flight.bind(asyncio.get_running_loop())
        while True:
            self._in_flight.clear()
            wait = redelivery_wait(self.table.next_deadline(), self.clock())
            if wait is None:
                await self._in_flight.wait(None)
            else:  # deliveries meanwhile set later deadlines: no need to wake for them
                await asyncio.sleep(wait)
            try:
                self.expire_deliveries()
            except Exception:  # a bug here must not stop every later redelivery
                log.exception("redelivery check failed")

    def expire_deliveries(self) -> None:
        self.after_due("visibility_timeout", self.table.expire(self.clock()))

    def release_holder(self, holder: Holder) -> None:
        """A stream ended: what it received and did not ack is delivered again now."""
        self.after_due("stream_end", self.table.release(holder))

    def not_sent(self, slices: list[Any]) -> None:
        """A response that took these slices was never sent: deliver them again now."""
        self.after_due("not_sent", self.table.redeliver_slices(slices))

    def nack_range(
        self, topic: str, partition: int, epoch: int, lo: int, hi: int, client: str, delay: float
    ) -> tuple[Problem | None, int]:
        """``client``'s records of [lo, hi) given back, to come again after ``delay``; why
        the nack is refused, or None, and how many records it concerned."""
        name = f"{topic}[{partition}]"
        tp = TP(topic, partition)
        part = self.table.get(tp)
        retired = self.retired_epoch(tp) if part is None else None
        problem = _ack_problem(part, epoch, name, self.clock(), retired)
        if problem is not None or part is None:
            return problem, 0
        try:
            count, due = self.table.nack(part, lo, hi, client, delay)
        except AckError as exc:
            return (stream_pb2.REJECT_REASON_NOT_DELIVERED, str(exc)), 0
        self.after_due("nack", due)
        return None, count

    def nack_all(self, client: str, delay: float) -> int:
        """Every record of ``client`` in flight here given back; how many."""
        count, due = self.table.nack_all(client, delay)
        self.after_due("nack", due)
        return count

    def after_due(self, why: str, due: Due) -> None:
        """Records came due: count them, report what was given up, and have the fetch
        thread re-read the partitions whose due records lie below their cursor."""
        if due.records:
            log.debug("records due again", why=why, records=due.records, rewind=len(due.rewind))
            self.on_redelivery(why, due.records)
        if due.given_up:
            self._uncommitted()  # the commit point passes what was given up
        for part, given_up in due.given_up:
            log.warning(
                "record given up: delivered the maximum number of times without an ack",
                topic=part.tp.topic,
                partition=part.tp.partition,
                from_offset=given_up.lo,
                to_offset=given_up.hi,
                deliveries=given_up.deliveries,
            )
            self.on_given_up(part.tp, part.epoch, given_up)
            if given_up.parked:
                self.on_dead_letter(part.tp, part.epoch, given_up, why)
        for part in due.rewind:
            self._tasks.spawn(self.fetcher.run(self.fetcher.rewind, part.tp))

    # ---- acks and commits -------------------------------------------------------------

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
        reject = _ack_problem(part, epoch, f"{topic}[{partition}]", self.clock(), retired)
        if reject is None and part is not None:
            try:
                apply(part)
            except AckError as exc:
                reject = (_ack_error_reason(exc), str(exc))
        if reject is not None:
            return reject
        self._uncommitted()
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
            self._uncommitted()

    def _uncommitted(self) -> None:
        """Something changed that the next commit round must carry: it comes within the
        commit interval, or at once after many acks or when the loop was idle."""
        self._acks_since_commit += 1
        if self._acks_since_commit >= self.commit_max_acks or self._commits_idle:
            self._commit_now.set()

    async def commit_loop(self) -> None:
        """Commit rounds: every ``commit_interval`` while acks come, at once when asked;
        and lapsed leases suspended at their local deadline. Idle (nothing acked, no lease
        deadline), the loop sleeps until an ack or a commit asked for."""
        self._loop = asyncio.get_running_loop()
        retry = False
        while True:
            wait = (
                self.commit_interval  # a failed round (Kafka, or a suspension) again
                if retry
                else commit_wait(
                    self._acks_since_commit > 0,
                    self.commit_interval,
                    self._next_lease_deadline(),
                    self.clock(),
                )
            )
            self._commits_idle = wait is None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._commit_now.wait(), wait)
            self._commits_idle = False
            self._commit_now.clear()
            self._acks_since_commit = 0
            retry = False
            try:
                await self.commit_all()
                self.on_commit(None)
                await self.suspend_expired()
            except Exception as exc:
                log.warning("commit failed; will retry", error=str(exc))
                self.on_commit(exc)
                retry = True

    def _stalled(self, gap: float, leases: int) -> None:
        """This process was away for ``gap`` seconds (stall_watch.py; either thread, the
        table's lock held): its Kafka-fenced leases wait for a commit to verify them."""
        if not leases:
            return
        log.warning(
            "this sidecar was stalled; its Kafka-fenced leases deliver again once a commit "
            "shows they are still its own",
            stalled_seconds=round(gap, 2),
            leases=leases,
        )
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._commit_now.set)

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

    def request_commit(self) -> None:
        """Have the commit loop commit soon (auto_ack's acks, answered by nobody)."""
        self._commit_now.set()

    async def commit_acked(self, touched: dict[TP, tuple[Partition, int]]) -> dict[TP, Problem]:
        """Make the acks applied so far durable before answering them (commit on ack), so
        a crash redelivers only what was delivered and not acked (ARCHITECTURE §3). Calls
        that overlap share the commits: each waits for one that covers its acks.

        ``touched``: each partition acked by the caller, with its acks' version right after
        they were applied. Returns the partitions for which no commit covering that version
        was made (the lease lapsed or was given up before the commit went out, or a
        kafka_group rebalance deferred it), with why: their acks must be refused, not
        answered accepted. Raises ``DsError`` KAFKA_UNAVAILABLE when Kafka refused the
        commit (the acks are kept; the ack may be retried)."""
        if not self.commit_on_ack:
            return {}
        try:
            await self.commit_all()
        except KafkaException as exc:
            raise DsError(
                Reason.KAFKA_UNAVAILABLE,
                f"acks recorded but not committed yet ({exc}); retry the ack",
            ) from exc
        failed: dict[TP, Problem] = {}
        now = self.clock()
        for tp, (part, version) in touched.items():
            if part.committed_version >= version:
                continue
            problem = lease_problem(part, now, part.epoch)
            failed[tp] = problem or (
                stream_pb2.REJECT_REASON_COMMIT_FAILED,
                "the acks were not committed (the lease was given up before the commit was "
                "sent); the records will be redelivered",
            )
        return failed

    async def commit_all(self) -> None:
        async with self._commit_lock:
            now = self.clock()
            requests = []
            parts = []
            versions = []
            stalls = []
            for part in self.table.snapshot():
                # A partition being handed off is committed too while its lease lasts: an
                # ack taken during the drain is durable before it is answered.
                if not part.ready or not part.live(now) or part.suspended_at is not None:
                    continue
                point, acked, version = self.table.commit_view(part)
                stall = part.unverified
                # Commit when the point moves, or when what is acked above it changed (the
                # metadata carries it, so a crash does not redeliver acked records), or to
                # verify a lease after a stall (the same offset again: Kafka refuses the
                # transaction if the lease moved meanwhile).
                if (
                    point > part.committed
                    or (point == part.committed and version != part.committed_version)
                    or stall
                ):
                    requests.append(CommitRequest(part.tp, point, part.epoch, acked))
                    parts.append(part)
                    versions.append(version)
                    stalls.append(stall)
            if not requests:
                return
            sent = await self.fetcher.commit_async(requests)
            self._announce_external()
            done = {id(r) for r in sent}  # a request the fetch thread dropped stays pending
            verified = False
            for part, request, version, stall in zip(
                parts, requests, versions, stalls, strict=True
            ):
                if id(request) in done:
                    part.committed = max(part.committed, request.offset)
                    part.committed_version = version
                    if stall and self.table.verified(part, stall):
                        verified = True
                        log.info(
                            "lease verified after a stall: delivering again",
                            topic=part.tp.topic,
                            partition=part.tp.partition,
                            epoch=part.epoch,
                        )
            if verified:
                self.on_renewed()  # wake the Fetches and Streams waiting for its records

    async def external_check_loop(self, interval: float) -> None:
        """Issue 23: every ``interval``, one OffsetFetch for all held partitions, to notice
        a commit this sidecar did not make on a partition nobody acks (the commits check
        the partitions they commit themselves, right before committing)."""
        while True:
            await asyncio.sleep(interval)
            if self.fetcher.external_changes == "ignore":
                continue  # the group's choice: no OffsetFetch, its commits overwrite them
            try:
                await self.check_external()
            except Exception as exc:  # Kafka unreachable: the next round tries again
                log.info("external commit check failed", error=str(exc))

    async def check_external(self) -> None:
        async with self._commit_lock:  # never while a commit of ours is on its way
            now = self.clock()
            tps = [
                p.tp
                for p in self.table.snapshot()
                if p.ready
                and p.live(now)
                and not p.revoking
                and p.external is None
                and p.epoch != UNLEASED_EPOCH
            ]
            if tps:
                await self.fetcher.check_external_async(tps)
        self._announce_external()

    def _announce_external(self) -> None:
        """Log each newly flagged or reverted external commit once and have the session
        report it."""
        fresh = [
            p for p in self.table.snapshot() if p.external is not None and not p.external_announced
        ]
        if any(p.reverted for p in self.table.snapshot()):
            self.on_external()
        if not fresh:
            return
        for part in fresh:
            part.external_announced = True
            assert part.external is not None
            log.warning(
                "external commit found: following it through the assigner",
                topic=part.tp.topic,
                partition=part.tp.partition,
                epoch=part.epoch,
                previous=part.committed,
                committed=part.external[0],
                metadata=part.external[1],
            )
        self.on_external()

    def take_reverted(self) -> list[Reverted]:
        """Revert mode: the external commits committed over since the last heartbeat."""
        taken: list[Reverted] = []
        with self.table.lock:
            for part in self.table.partitions.values():
                taken += part.reverted
                part.reverted = []
        for r in taken:
            log.warning(
                "external commit reverted: the mesh's position committed over it",
                topic=r.tp.topic,
                partition=r.tp.partition,
                epoch=r.epoch,
                restored=r.restored,
                external=r.external,
                metadata=r.metadata,
            )
        return taken

    def external_commits(self) -> list[tuple[Partition, int, str]]:
        """(partition, offset, metadata) of every held partition with an external commit."""
        return [
            (p, p.external[0], p.external[1])
            for p in self.table.snapshot()
            if p.external is not None and not p.revoking
        ]

    async def commit_offsets(self, commits: list[ExplicitCommit]) -> list[CommitOutcome]:
        """Commit explicit offsets, each fenced by its lease epoch and the local deadline,
        in one Kafka commit on the fetch thread. Outcomes in the order of ``commits``."""
        async with self._commit_lock:
            now = self.clock()
            outcomes: dict[int, CommitOutcome] = {}
            accepted: list[tuple[int, Partition, ExplicitCommit]] = []
            for index, commit in enumerate(commits):
                part = self.table.get(commit.tp)
                problem = lease_problem(part, now, commit.epoch)
                if problem is not None:
                    outcomes[index] = CommitOutcome(commit, *problem)
                elif part is not None:
                    accepted.append((index, part, commit))
            if accepted:
                requests = [CommitRequest(c.tp, c.offset, c.epoch) for _, _, c in accepted]
                try:
                    sent = await self.fetcher.commit_async(requests)
                    self._announce_external()
                except KafkaException as exc:
                    log.warning("explicit commit failed", error=str(exc))
                    for index, _, commit in accepted:
                        outcomes[index] = CommitOutcome(
                            commit, stream_pb2.REJECT_REASON_COMMIT_FAILED, str(exc)
                        )
                else:
                    done = {id(r) for r in sent}
                    for (index, part, commit), request in zip(accepted, requests, strict=True):
                        if id(request) not in done:  # its lease lapsed before it was sent
                            problem = lease_problem(part, self.clock(), commit.epoch)
                            reason, detail = problem or (
                                stream_pb2.REJECT_REASON_COMMIT_FAILED,
                                "the lease was given up before the commit was sent",
                            )
                            outcomes[index] = CommitOutcome(commit, reason, detail)
                            continue
                        part.committed = commit.offset
                        outcomes[index] = CommitOutcome(
                            commit, stream_pb2.REJECT_REASON_UNSPECIFIED
                        )
            return [outcomes[i] for i in range(len(commits))]

    async def _final_commit(self, part: Partition) -> int:
        """A revoked partition's commit of what was acked. Kafka refusing it is reported
        (COMMIT_FAILED) and retried with backoff while the lease lasts (its deadline stops
        the retries: a revoking lease is no longer renewed); the partition is released
        either way, with the offset that is committed (the next owner resumes there, acked
        records after it come again: nothing is lost)."""
        backoff, longest = FINAL_COMMIT_BACKOFF
        failed = False
        while True:
            if failed and not part.live(self.clock()):
                return part.committed  # the lease is over: release what is committed
            try:
                committed = await self._commit_partition(part)
            except KafkaException as exc:
                failed = True
                self.on_commit(exc)
                remaining = part.deadline - self.clock()
                log.warning(
                    "final commit of a revoked partition failed; retrying while the lease lasts",
                    topic=part.tp.topic,
                    partition=part.tp.partition,
                    error=str(exc),
                    lease_left=round(max(0.0, remaining), 2),
                )
                await asyncio.sleep(max(0.0, min(backoff, remaining)))
                backoff = min(backoff * 2, longest)
                continue
            if failed:
                self.on_commit(None)
            return committed

    async def _commit_partition(self, part: Partition) -> int:
        async with self._commit_lock:
            point, acked, version = self.table.commit_view(part)
            moved = point > part.committed or (
                point == part.committed and version != part.committed_version
            )
            if part.ready and moved and part.live(self.clock()):
                request = CommitRequest(part.tp, point, part.epoch, acked)
                if await self.fetcher.commit_async([request]):
                    part.committed = point
                    part.committed_version = version
            return part.committed
