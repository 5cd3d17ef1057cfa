"""The one Kafka consume loop of a sidecar, on its own thread.

It polls continuously, whatever the application does (so an infrequent caller can never
make Kafka kick anybody, ARCHITECTURE §1.2), buffers records per partition, and keeps memory
under the cap (backpressure): a full buffer holds consume() back for a moment, then pauses
partitions; one partition past its share of the buffer is paused. In leased mode
partitions are added and removed with ``incremental_assign``/``incremental_unassign`` —
never ``subscribe()``, so Kafka never rebalances a leased group. In ``kafka_group`` mode
(:mod:`services.consumer_sidecar.kafka_group_membership`) the assign() consumer is replaced by a
``subscribe()`` one whose rebalance callbacks run here, inside ``consume()``, and back
again when the group switches to leased mode. Every
consumer call happens on this thread (other threads hand it commands and wait on a future).
How long each poll() waits (busy, active, quiet): :mod:`~services.consumer_sidecar.poll_timing`.
Leased mode's commits go through a second consumer of the group, on a commit thread of its
own (:meth:`Fetcher.commit_async`); with ``commit_fencing: kafka`` through each lease's
transactional producer instead (:mod:`~services.consumer_sidecar.kafka_fenced_commits`),
whose id is initialised here, on a grant, before the start offset is read.

Positions move back when records come due again (:meth:`Fetcher.rewind`: the partition
table says where) and forward only where Kafka forces it: in leased mode the consumer runs
with ``auto.offset.reset=error``, so a position that fell outside the log (records deleted
by retention before they were read, a truncated log) is an error here instead of a silent
jump; the loop moves to the log start (or end) itself and reports the offsets it skipped
(:attr:`Fetcher.on_gap`: ``ds_sidecar_offset_gaps_total`` and an ``OFFSET_GAP`` fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from services.consumer_sidecar import fetch_backpressure, poll_timing
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.kafka_fenced_commits import FencedCommitter, LeaseFenced
from services.consumer_sidecar.partitions import UNLEASED_EPOCH, PartitionTable, Reverted
from services.consumer_sidecar.runs import runs_from_messages
from services.runtime import commitmeta
from services.runtime.topic_partition import TP

if TYPE_CHECKING:
    from services.consumer_sidecar.kafka_group_membership import ClassicMembership

log = structlog.get_logger(__name__)
R = TypeVar("R")

DEFERRED_COMMIT_RETRY_SECONDS = 0.2
# Leaving kafka_group mode: how long Kafka may take to revoke the partitions after
# unsubscribe(), beyond the time the revoke callback drains in-flight acks.
UNSUBSCRIBE_SECONDS = 10.0
COMMITTER_SERVE_SECONDS = 1.0
RESET_RETRY_SECONDS = 1.0  # a position out of range whose watermarks could not be read
WATERMARK_TIMEOUT_SECONDS = 5.0
WARM_UP_TIMEOUT_SECONDS = 5.0  # warm_up's committed(): the first grants' assign waits for it
# Errors that mean the fetch position is outside the partition's log (auto.offset.reset
# is "error"): the partition stops fetching until it is given a position again.
_OUT_OF_RANGE_ERRORS = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError._LOG_TRUNCATION})
# kafka_group mode: commit errors that only mean "the group is rebalancing right now".
_REBALANCE_COMMIT_ERRORS = frozenset(
    {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID}
)


@dataclass(frozen=True)
class CommitRequest:
    tp: TP
    offset: int
    epoch: int
    acked: tuple[tuple[int, int], ...] = ()  # acked ranges above ``offset`` (metadata)


class Fetcher:
    def __init__(
        self,
        consumer: Consumer,
        table: PartitionTable,
        *,
        sidecar_id: str,
        batch: int,
        on_data: Callable[[], None],
        on_error: Callable[[KafkaError], None] | None = None,
        committer: Consumer | None = None,
        prefetch_bytes: int = 0,
    ) -> None:
        self._consumer = consumer
        self._commit_consumer = committer
        self._table = table
        self._sidecar_id = sidecar_id
        self._batch = batch
        self._on_data = on_data
        self._on_error = on_error
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-fetch", daemon=True)
        # Wakes the loop while it holds consumption back: a delivery made room, or a command.
        self._wake = threading.Event()
        table.on_room = self._wake.set
        self._set_prefetch(prefetch_bytes)
        # Leased mode's commits, when a ``committer`` consumer is given: an application's ack
        # waits for its commit, and on the fetch thread a commit first waited for the
        # consume() in progress and then held fetching up for its round trip (half of a
        # Fetch+ack cycle's time in the benchmark). confluent-kafka serializes the calls on
        # one handle, hence a consumer of its own: a group without members (leased mode
        # never subscribes) takes commits from any consumer of it.
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-commit")
        self.last_poll = time.monotonic()
        self.classic = False  # True once subscribe()d (kafka_group mode)
        # The group's external_offset_changes (issue 23): follow | revert | ignore.
        self.external_changes = "follow"
        # When each partition's committed offset was last read back (monotonic): before a
        # commit it is read back again only if that is older than this (see
        # _without_external), so the ack path pays the round trip at most once per interval.
        self.external_check_seconds = 0.5
        self._read_back: dict[TP, float] = {}
        self.subscribed = False  # kafka_group mode: the consumer of now is subscribe()d
        self._deferred: dict[TP, CommitRequest] = {}  # kafka_group: refused mid-rebalance
        # Every topic this consumer was ever given: with one, records need no topic lookup.
        self._topics: set[str] = set()
        self._deferred_retry_at = 0.0
        self._serve_at = 0.0
        self._full_since: float | None = None  # leased mode: since when the buffer is full
        # Instrumentation hooks (metrics.py), all called on this thread.
        self.on_poll: Callable[[float, float], None] = lambda _started, _returned: None
        self.on_consumed: Callable[[str, int, int], None] = lambda _topic, _n, _bytes: None
        self.on_commit_request: Callable[[bool, float], None] = lambda _ok, _seconds: None
        # The not-fetching gaps: records of a partition came out of consume() (partition,
        # when, the first record's timestamp in ms or -1); and every loop, the time of the
        # last poll (the gaps look at the table).
        self.on_fetched: Callable[[TP, float, int], None] = lambda _tp, _at, _ts: None
        self.on_loop: Callable[[float], None] = lambda _now: None
        # A position outside the log: (partition, first offset skipped, where fetching
        # went on, reason). Records [first, next) were never read.
        self.on_gap: Callable[[TP, int, int, str], None] = lambda _tp, _lo, _hi, _why: None
        # Leased mode: where a position outside the log goes (the configured
        # auto.offset.reset: the log start, or with latest/largest/end its end).
        self.reset_to_end = False
        self._resets: dict[TP, int] = {}  # out-of-range positions still to move
        self._resets_retry_at = 0.0
        # commit_fencing: kafka: the lease producers that make (and fence) the commits of
        # the leases granted under it (Partition.kafka_fenced); the others (and all, when
        # None) commit through the commit consumer, fenced by the local deadlines.
        self.fenced: FencedCommitter | None = None
        # A lease whose commit Kafka refused for good (a newer holder fenced it), from the
        # commit thread: the lease keeper drops it.
        self.on_fenced: Callable[[LeaseFenced], None] = lambda _fenced: None

    # ---- API for other threads --------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._committer.shutdown(wait=True)
        if self._commit_consumer is not None:
            self._commit_consumer.close()
        if self.fenced is not None:
            self.fenced.close_all()
        self._stop.set()
        self._thread.join(timeout=30)

    def call(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` on the fetch thread (between polls); a future of its result."""
        future: Future[R] = Future()
        self._commands.put((functools.partial(fn, *args), future))
        self._wake.set()
        return future

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.wrap_future(self.call(fn, *args))

    async def commit_async(self, requests: list[CommitRequest]) -> list[CommitRequest]:
        """:meth:`commit` off the event loop. Leased mode: through the commit consumer on the
        commit thread, so the commit neither waits for the consume() in progress nor stops
        fetching for its round trip (the lease checks are made there, right before it, as
        on the fetch thread). kafka_group mode (or without a commit consumer): on the fetch
        thread, where commits interleave with the rebalance callbacks that consume() runs."""
        if self.classic or self._commit_consumer is None:
            return await self.run(self.commit, requests)
        future = self._committer.submit(self.commit, requests, self._commit_consumer)
        return await asyncio.wrap_future(future)

    def assign(self, starts: dict[TP, int]) -> dict[TP, int]:
        """Fetch thread: start fetching each partition at its start offset (<0 = the group's
        committed offset, else the earliest). One committed() round trip for the batch.
        Returns the offset each partition starts from."""
        resolved = dict(starts)
        self._open_leases(starts)
        # One committed() round trip for all: the offsets where none was given, and for
        # every partition the metadata with what the previous owner acked above it.
        preacked: dict[TP, tuple[tuple[int, int], ...]] = {}
        queried = [TopicPartition(tp.topic, tp.partition) for tp in starts]
        for found in self._consumer.committed(queried, timeout=10) if queried else []:
            tp = TP(str(found.topic), int(found.partition or 0))
            committed = int(found.offset if found.offset is not None else -1)
            if resolved[tp] < 0:
                resolved[tp] = committed
            meta = commitmeta.decode(found.metadata, committed)
            if meta is not None and meta.acked and committed >= 0 and resolved[tp] == committed:
                preacked[tp] = meta.acked
        for tp, offset in resolved.items():
            if offset < 0:
                low, _high = self._consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=10
                )
                resolved[tp] = low if low >= 0 else OFFSET_BEGINNING
        # Ready *before* fetching starts: this thread appends the first records as soon as
        # consume() returns them, and a partition that is not ready drops them.
        assigned: dict[TP, int] = {}
        with self._table.lock:
            for tp, offset in resolved.items():
                part = self._table.partitions.get(tp)
                if part is None or part.revoking or part.ready:
                    continue  # revoked or expired while the offsets were looked up
                part.acks = PartitionAcks(offset, preacked=preacked.get(tp, ()))
                part.position = offset
                part.committed = offset
                part.ready = True
                assigned[tp] = offset
        ktps = [TopicPartition(tp.topic, tp.partition, offset) for tp, offset in assigned.items()]
        self._topics.update(tp.topic for tp in assigned)
        current = self._assignment()
        if stale := [TopicPartition(tp.topic, tp.partition) for tp in assigned if tp in current]:
            # Left over from an earlier epoch of this sidecar (a suspended lease the assigner
            # granted back under a new epoch): incremental_assign refuses a partition already
            # assigned (_CONFLICT), so start over at the new start offset.
            self._consumer.incremental_unassign(stale)
        if ktps:
            self._consumer.incremental_assign(ktps)
            # librdkafka keeps a partition's pause flag across unassign/assign: a partition
            # paused (backpressure, suspension) and later granted back would never fetch.
            self._consumer.resume(ktps)
        return assigned

    def _open_leases(self, starts: dict[TP, int]) -> None:
        """commit_fencing: kafka: initialise each granted lease's transactional id before
        its start offset is read (fencing the previous holder; kafka_fenced_commits.py).
        One that fails is not started (a retriable error is retried by the caller)."""
        if self.fenced is None or self.classic:
            return
        epochs = {
            tp: part.epoch
            for tp in starts
            if (part := self._table.get(tp)) is not None
            and part.kafka_fenced
            and not part.revoking
            and not part.ready
        }
        if not epochs:
            return
        errors = self.fenced.open(epochs)
        if errors:
            raise next(iter(errors.values()))

    def warm_up(self, topics: list[str]) -> None:
        """Fetch thread: before any partition is granted here, find the group's coordinator
        (one committed() round trip) and read the topics' metadata (list_topics: their
        leaders, into librdkafka's cache), so that a fresh consumer's first grants need
        neither. Measured on a sidecar returning under ``hold_mode: handoff``: its first
        assign's committed() took 0.7 s, the next one 0.05 s; and on a fresh consumer
        (one broker, 2 shared cores) committed() 0.25-0.55 s cold vs 0.003-0.06 s after the
        lookup, assign to first records 0.41-0.56 s without the metadata vs 0.05-0.17 s
        with it. The handed-back partitions waited for both. Best effort: a failure is
        left to the assign."""
        if not topics or self.classic:
            return
        try:
            self._consumer.committed(
                [TopicPartition(topic, 0) for topic in topics], timeout=WARM_UP_TIMEOUT_SECONDS
            )
            for topic in topics:
                self._consumer.list_topics(topic, timeout=WARM_UP_TIMEOUT_SECONDS)
        except KafkaException as exc:
            log.info("warm-up before the first grants failed", error=str(exc))

    def suspend(self, tp: TP) -> None:
        """Fetch thread: a suspended lease (local deadline passed) stops fetching and is
        rewound to its delivery cursor (its first due record, else its first undelivered
        one), so the dropped buffer is fetched again if the lease is renewed. Runs in order
        with :meth:`resume` (same thread, FIFO)."""
        with self._table.lock:
            part = self._table.partitions.get(tp)
            if part is None or part.suspended_at is None:
                return
            part.rewinding = False  # the suspension rewinds it
            offset = part.acks.rewind()
            part.position = offset
        ktp = TopicPartition(tp.topic, tp.partition, offset)
        self._consumer.pause([ktp])
        self._seek(ktp)

    def rewind(self, tp: TP) -> None:
        """Fetch thread: records of ``tp`` came due below its delivery cursor: drop its
        buffer and fetch again from the first of them (:meth:`PartitionTable.rewind`).
        Runs between consume() calls, so nothing fetched from the old position is buffered
        after it (seek discards librdkafka's prefetched records)."""
        offset = self._table.rewind(tp)
        if offset is None:
            return
        log.debug(
            "re-reading records due again", topic=tp.topic, partition=tp.partition, offset=offset
        )
        part = self._table.get(tp)
        if part is None or part.suspended_at is not None:
            return  # suspended: the position is set; resume() fetches from it
        self._seek(TopicPartition(tp.topic, tp.partition, offset))

    def _seek(self, ktp: TopicPartition) -> None:
        """Move a partition's fetch position; one that is not fetching at all (librdkafka
        refuses to seek it) is assigned again at the position, its pause kept."""
        try:
            self._consumer.seek(ktp)
        except KafkaException as exc:
            log.info("seek refused; assigning again", partition=ktp.partition, error=str(exc))
            self._reassign(ktp)

    def _reassign(self, ktp: TopicPartition) -> None:
        tp = TP(str(ktp.topic), int(ktp.partition or 0))
        if tp in self._assignment():
            self._consumer.incremental_unassign([TopicPartition(tp.topic, tp.partition)])
        self._consumer.incremental_assign([ktp])
        part = self._table.get(tp)
        if part is not None and (part.paused or part.suspended_at is not None):
            self._consumer.pause([ktp])
        else:
            self._consumer.resume([ktp])  # librdkafka keeps the pause flag across assigns

    def restart(self, tp: TP, offset: int) -> None:
        """Fetch thread: forget what ``tp`` buffered and has in flight and fetch it from
        ``offset`` (:meth:`PartitionTable.restart`); acks of records delivered before are
        refused from now on."""
        part = self._table.get(tp)
        if part is None or not part.ready:
            return
        self._table.restart(part, offset)
        self._seek(TopicPartition(tp.topic, tp.partition, offset))

    def resume(self, tp: TP) -> None:
        """Fetch thread: the lease was renewed: clear the suspension, fetch again."""
        with self._table.lock:
            part = self._table.partitions.get(tp)
            if part is None:
                return
            part.suspended_at = None
            part.paused = False
        self._consumer.resume([TopicPartition(tp.topic, tp.partition)])

    def unassign(self, tp: TP) -> None:
        """Fetch thread: stop fetching ``tp`` (a no-op when it is not assigned), and end
        its lease producer (commit_fencing: kafka)."""
        part = self._table.get(tp)
        if self.fenced is not None and (part is None or part.revoking):
            self.fenced.close(tp)
        if tp in self._assignment():
            self._consumer.incremental_unassign([TopicPartition(tp.topic, tp.partition)])

    def _assignment(self) -> set[TP]:
        return {TP(str(k.topic), int(k.partition or 0)) for k in self._consumer.assignment()}

    def _set_prefetch(self, prefetch_bytes: int) -> None:
        # Held back, librdkafka keeps up to ``prefetch_bytes`` (queued.max.messages.kbytes)
        # prefetched: holding starts that much below the cap (PartitionTable.hold_at).
        self._table.prefetch_bytes = prefetch_bytes

    def replace_consumer(self, config: dict[str, Any]) -> int:
        """Fetch thread, leased mode: a group config change librdkafka cannot apply to a
        running consumer (it can apply none). The new consumer takes over every partition
        the old one fetches, each at the next offset the buffer has not got yet, paused if
        it was (backpressure, a suspended lease); then the old one is closed. The buffer,
        what is in flight and the acks stay as they are (they are the table's, not the
        consumer's), and commits go through the commit consumer meanwhile: nothing is
        delivered twice or skipped, no lease changes, and clients never notice. Whatever
        the old consumer had prefetched beyond the buffer is fetched again. A config
        librdkafka refuses raises KafkaException here, with nothing changed. Returns how
        many partitions moved over."""
        consumer = Consumer(config)
        try:
            starts: list[TopicPartition] = []
            paused: list[TopicPartition] = []
            with self._table.lock:
                for tp in sorted(self._assignment()):
                    part = self._table.partitions.get(tp)
                    if part is None or part.revoking or not part.ready:
                        continue  # being given up: its unassign() finds nothing to do
                    ktp = TopicPartition(tp.topic, tp.partition, part.position)
                    starts.append(ktp)
                    if part.paused or part.suspended_at is not None:
                        paused.append(ktp)
            if starts:
                consumer.incremental_assign(starts)
            if paused:
                consumer.pause(paused)
        except BaseException:
            consumer.close()
            raise
        old, self._consumer = self._consumer, consumer
        self._set_prefetch(int(config.get("queued.max.messages.kbytes", 0)) * 1024)
        old.close()
        return len(starts)

    def resubscribe(
        self, config: dict[str, Any], topics: list[str], membership: ClassicMembership
    ) -> None:
        """Fetch thread, kafka_group mode: a new subscribe()d consumer for a changed group
        config. The old member hands its partitions back as on a revoke (stop delivering,
        drain in-flight acks, commit them) and closes; a static member sends no LeaveGroup,
        so the new consumer joins under the same ``group.instance.id`` in its place and
        Kafka gives the partitions back starting at the commits. A config librdkafka
        refuses raises KafkaException before anything is handed back."""
        consumer = Consumer(config)
        membership.release_all()
        old, self._consumer = self._consumer, consumer
        self.subscribed = False
        self._deferred.clear()  # the partitions were just committed and handed back
        old.close()
        self._subscribe(consumer, topics, membership)

    def _subscribe(
        self, consumer: Consumer, topics: list[str], membership: ClassicMembership
    ) -> None:
        membership.subscribing()
        consumer.subscribe(
            topics,
            on_assign=membership.on_assign,
            on_revoke=membership.on_revoke,
            on_lost=membership.on_lost,
        )
        self.subscribed = True

    def use_classic(
        self, config: dict[str, Any], topics: list[str], membership: ClassicMembership
    ) -> None:
        """Fetch thread: kafka_group mode. Replace the (idle) assign() consumer by one that
        subscribe()s to ``topics``; Kafka's rebalances reach ``membership`` on this thread."""
        consumer = Consumer(config)
        self._topics.update(topics)
        if any(t.startswith("^") for t in topics):
            self._topics.add("^")  # a pattern may match several topics: always look them up
        try:
            self._subscribe(consumer, topics, membership)
        except Exception:
            consumer.close()
            raise
        old, self._consumer = self._consumer, consumer
        self.classic = True
        old.close()

    def use_assign(self, config: dict[str, Any], membership: ClassicMembership) -> list[TP]:
        """Fetch thread: back from kafka_group mode to leased mode. unsubscribe() makes
        Kafka revoke every partition (``membership`` drains, commits and forgets each,
        inside the consume() calls here) and the member leave the group — at once, static
        membership included (librdkafka skips the LeaveGroup of a static member only when
        it closes). Then a fresh assign() consumer takes over. Returns the partitions that
        were dropped without a revoke (Kafka did not answer in time): their unacked records
        are delivered again."""
        consumer = self._consumer
        consumer.unsubscribe()
        deadline = time.monotonic() + membership.drain_timeout + UNSUBSCRIBE_SECONDS
        while time.monotonic() < deadline:
            messages = consumer.consume(self._batch, poll_timing.POLL_TIMEOUT_SECONDS)
            self.last_poll = time.monotonic()
            if messages:
                self._buffer(messages)  # partitions not yet revoked still deliver
            if not consumer.assignment() and not self._table.snapshot():
                break
        dropped = [p.tp for p in self._table.snapshot() if p.epoch == UNLEASED_EPOCH]
        for tp in dropped:
            self._table.remove(tp)
        self._consumer = Consumer(config)
        self.classic = False
        self._deferred.clear()
        consumer.close()
        return dropped

    def commit_offsets(self, commits: list[tuple[TP, int]]) -> None:
        """Fetch thread: kafka_group mode's commit (no lease: epoch 0 in the metadata)."""
        self.commit([CommitRequest(tp, offset, UNLEASED_EPOCH) for tp, offset in commits])

    def commit(
        self, requests: list[CommitRequest], consumer: Consumer | None = None
    ) -> list[CommitRequest]:
        """Commit thread or fetch thread (:meth:`commit_async`): synchronous commit; the
        metadata records the lease epoch (§3.1.6).
        Returns the requests committed (the others were dropped, see below).

        A request queued before its partition was given up (revoked, fenced, or handed
        back to Kafka) is dropped: only a partition still held with the same epoch is
        committed. So is one whose local lease deadline passed while it waited in the
        command queue: a process paused (SIGSTOP, a VM stall) between the asyncio side's
        check and this thread's turn must not commit when it wakes, since the partition may
        be another sidecar's by then and Kafka does not fence commits from non-members
        (ARCHITECTURE §10). The deadline is checked here, the last moment before the
        request is handed to librdkafka. In kafka_group mode every epoch is 0, so a
        partition Kafka handed back to us meanwhile is told apart by its committed offset:
        never commit below it."""
        now = self._table.clock()
        kept = [r for r in requests if self._still_committable(r, now)]
        if self.fenced is None:  # never outside its transaction (it has no deadline)
            kept = [r for r in kept if not self._kafka_fenced(r.tp, r.epoch)]
        if not self.classic and self.external_changes != "ignore":
            kept = self._without_external(kept, consumer or self._consumer)
        if not kept:
            return []
        offsets = [
            TopicPartition(
                r.tp.topic,
                r.tp.partition,
                r.offset,
                metadata=commitmeta.encode(r.epoch, self._sidecar_id, r.offset, r.acked),
            )
            for r in kept
        ]
        started = time.monotonic()
        if self.fenced is not None and not self.classic:
            fenced = [i for i, r in enumerate(kept) if self._kafka_fenced(r.tp, r.epoch)]
            if len(fenced) == len(kept):
                return self._commit_fenced(kept, offsets, started)
            if fenced:  # both kinds (the group's commit_fencing changed): each its own way
                done = self._commit_fenced(
                    [kept[i] for i in fenced], [offsets[i] for i in fenced], started
                )
                return done + self.commit(
                    [r for i, r in enumerate(kept) if i not in set(fenced)], consumer
                )
        try:
            result = (consumer or self._consumer).commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self.on_commit_request(False, time.monotonic() - started)
            if self._defer_if_rebalancing(exc, kept):
                return []
            raise
        failed = [
            (r, tp.error) for r, tp in zip(kept, result or [], strict=False) if tp.error is not None
        ]
        self.on_commit_request(not failed, time.monotonic() - started)
        self._warn_if_outlived(kept)
        for request, error in failed:
            if not self._defer_if_rebalancing(KafkaException(error), [request]):
                raise KafkaException(error)
        return kept

    def _kafka_fenced(self, tp: TP, epoch: int) -> bool:
        """The lease (tp, epoch) was granted under commit_fencing: kafka."""
        part = self._table.get(tp)
        return part is not None and part.epoch == epoch and part.kafka_fenced

    def _commit_fenced(
        self, kept: list[CommitRequest], offsets: list[TopicPartition], started: float
    ) -> list[CommitRequest]:
        """commit_fencing: kafka: each request in its lease's transaction. A lease Kafka
        fenced is handed to :attr:`on_fenced` (it is over here) and left out of what is
        returned; a retriable failure raises once the others are done."""
        assert self.fenced is not None
        result = self.fenced.commit((r.tp, r.epoch, o) for r, o in zip(kept, offsets, strict=True))
        self.on_commit_request(not (result.fenced or result.failed), time.monotonic() - started)
        for fenced in result.fenced:
            with self._table.lock:
                part = self._table.partitions.get(fenced.tp)
                if part is not None and part.epoch == fenced.epoch:
                    part.revoking = True  # nothing more of it is delivered or committed
            self.on_fenced(fenced)
        if result.failed:
            raise next(iter(result.failed.values()))
        done = set(result.committed)
        return [r for r in kept if r.tp in done]

    def _without_external(
        self, requests: list[CommitRequest], consumer: Consumer
    ) -> list[CommitRequest]:
        """Leased mode, right before a commit: one OffsetFetch for the partitions about to
        be committed that were not read back within ``external_check_seconds`` (by the
        check loop or an earlier commit), so a commit does not overwrite an external one
        it could have seen (issue 23); a partition with one is flagged
        (:meth:`check_external`) and dropped. Not on every commit: with commit on ack that
        round trip is on the ack's path (tests/bench/bench_external_check.py); an external
        commit landing after the last read-back is overwritten and followed from the
        commit log instead (services/assigner/commit_log.py)."""
        now = time.monotonic()
        due = self.external_check_seconds
        leased = {
            r.tp: r.offset
            for r in requests
            if r.epoch != UNLEASED_EPOCH and now - self._read_back.get(r.tp, -math.inf) >= due
        }
        if leased:
            # In revert mode the commit about to be made is the revert.
            self.check_external(list(leased), consumer, restore=leased)
        return [r for r in requests if (p := self._table.get(r.tp)) is None or p.external is None]

    def check_external(
        self,
        tps: list[TP],
        consumer: Consumer | None = None,
        *,
        restore: dict[TP, int] | None = None,
    ) -> list[TP]:
        """Commit thread: read the committed offsets of held partitions (one OffsetFetch)
        and find each whose commit this sidecar did not make
        (:func:`~services.runtime.commitmeta.is_external`). Following them (the group's
        default) flags them; in revert mode each is committed over at once with this
        sidecar's position (``restore``'s offset when a commit of it is about to be made
        anyway, else the last one it committed) and kept for the next heartbeat's report.
        Returns the newly flagged or reverted."""
        queried = [TopicPartition(tp.topic, tp.partition) for tp in tps]
        consumer = consumer or self._commit_consumer or self._consumer
        found = consumer.committed(queried, timeout=10)
        read_at = time.monotonic()
        for tp in tps:
            self._read_back[tp] = read_at
        flagged = []
        reverting: list[Reverted] = []
        for ktp in found:
            tp = TP(str(ktp.topic), int(ktp.partition or 0))
            part = self._table.get(tp)
            if part is None or part.external is not None or ktp.error is not None:
                continue
            offset = int(ktp.offset if ktp.offset is not None else -1)
            if not commitmeta.is_external(offset, ktp.metadata, part.committed):
                continue
            flagged.append(tp)
            position = (restore or {}).get(tp, part.committed)
            if self.external_changes == "revert" and position >= 0:
                reverting.append(Reverted(tp, part.epoch, position, offset, ktp.metadata or ""))
            else:  # nothing of ours to put back: follow it
                part.external = (offset, ktp.metadata or "")
        now_due = [r for r in reverting if restore is None or r.tp not in restore]
        if now_due:
            self._recommit(now_due, consumer)
        with self._table.lock:  # for the next heartbeat's report (LeaseCommitter.take_reverted)
            for r in reverting:
                if (part := self._table.partitions.get(r.tp)) is not None:
                    part.reverted.append(r)
        return flagged

    def _recommit(self, reverting: list[Reverted], consumer: Consumer) -> None:
        """Revert mode: commit this sidecar's position over external commits, each fenced
        by its lease epoch and local deadline like every commit."""
        now = self._table.clock()
        live = [
            r
            for r in reverting
            if (p := self._table.get(r.tp)) is not None and p.epoch == r.epoch and p.live(now)
        ]
        if not live:
            return
        offsets = [
            TopicPartition(
                r.tp.topic,
                r.tp.partition,
                r.restored,
                metadata=commitmeta.encode(r.epoch, self._sidecar_id, r.restored, ()),
            )
            for r in live
        ]
        fenced = [i for i, r in enumerate(live) if self._kafka_fenced(r.tp, r.epoch)]
        if self.fenced is not None and fenced:
            self._commit_fenced(
                [CommitRequest(live[i].tp, live[i].restored, live[i].epoch) for i in fenced],
                [offsets[i] for i in fenced],
                time.monotonic(),
            )
        # A Kafka-fenced lease never commits outside its transaction (it has no deadline).
        plain = [o for i, o in enumerate(offsets) if i not in set(fenced)]
        if plain:
            consumer.commit(offsets=plain, asynchronous=False)

    async def check_external_async(self, tps: list[TP]) -> list[TP]:
        """:meth:`check_external` on the commit thread (the fetch thread without one)."""
        if self._commit_consumer is None:
            return await self.run(self.check_external, tps)
        future = self._committer.submit(self.check_external, tps, self._commit_consumer)
        return await asyncio.wrap_future(future)

    def _warn_if_outlived(self, committed: list[CommitRequest]) -> None:
        """A commit whose lease deadline passed while librdkafka sent it (the process was
        paused inside the call) may have reached Kafka after the partition moved: say so,
        with what was committed, so an operator can tell a late commit from a fencing bug."""
        now = self._table.clock()
        for request in committed:
            part = self._table.get(request.tp)
            if part is not None and part.epoch == request.epoch and not part.live(now):
                log.warning(
                    "commit outlived its lease: it may have landed after the partition moved",
                    topic=request.tp.topic,
                    partition=request.tp.partition,
                    offset=request.offset,
                    epoch=request.epoch,
                )

    def _defer_if_rebalancing(self, exc: KafkaException, requests: list[CommitRequest]) -> bool:
        """kafka_group mode: a commit refused because a rebalance is under way (the member's
        generation is changing) is not a failure of the sidecar. It is retried on this thread
        once the rebalance completes (:meth:`_retry_deferred`); a partition revoked
        meanwhile has been committed by the revoke callback, one lost is dropped."""
        error = exc.args[0] if exc.args else None
        if not (self.classic and isinstance(error, KafkaError)):
            return False
        if error.code() not in _REBALANCE_COMMIT_ERRORS:
            return False
        for request in requests:
            self._deferred[request.tp] = request
        return True

    def _retry_deferred(self) -> None:
        deferred, self._deferred = self._deferred, {}
        now = self._table.clock()
        requests = [r for r in deferred.values() if self._still_committable(r, now)]
        if not requests:
            return
        try:
            self.commit(requests)
        except KafkaException as exc:
            log.warning("deferred commit failed", error=str(exc))

    def _still_committable(self, request: CommitRequest, now: float) -> bool:
        part = self._table.get(request.tp)
        if part is None or part.epoch != request.epoch or not part.live(now):
            return False
        if part.external is not None:
            return False  # an external commit is being followed: never overwrite it
        return not self.classic or request.offset >= part.committed

    # ---- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        busy_until = 0.0
        quiet_at = self.last_poll + poll_timing.QUIET_SECONDS
        try:
            while not self._stop.is_set():
                if self._run_commands():
                    busy_until = self.last_poll + poll_timing.BUSY_SECONDS
                    quiet_at = self.last_poll + poll_timing.QUIET_SECONDS
                self.on_loop(self.last_poll)
                self._table.alive(time.monotonic())  # a stall of the process shows here
                if self._holding():
                    self._wake.wait(poll_timing.POLL_TIMEOUT_SECONDS)
                    self._wake.clear()
                    self.last_poll = time.monotonic()  # alive, holding back on purpose
                    quiet_at = self.last_poll + poll_timing.QUIET_SECONDS
                    continue
                if self._deferred or self._resets:
                    quiet_at = self.last_poll + poll_timing.QUIET_SECONDS  # retries are due soon
                poll_started = time.monotonic()
                messages = self._take(poll_timing.poll_timeout(poll_started, busy_until, quiet_at))
                self.last_poll = time.monotonic()
                self.on_poll(poll_started, self.last_poll)
                if messages:
                    quiet_at = self.last_poll + poll_timing.QUIET_SECONDS
                    if self._commits_here():
                        busy_until = self.last_poll + poll_timing.BUSY_SECONDS
                    self._buffer(messages)
                self._apply_backpressure()
                if self._commit_consumer is not None and self.last_poll >= self._serve_at:
                    self._serve_at = self.last_poll + COMMITTER_SERVE_SECONDS
                    self._serve_committer()
                if self._deferred and self.last_poll >= self._deferred_retry_at:
                    self._deferred_retry_at = self.last_poll + DEFERRED_COMMIT_RETRY_SECONDS
                    self._retry_deferred()
                if self._resets and self.last_poll >= self._resets_retry_at:
                    self._resets_retry_at = self.last_poll + RESET_RETRY_SECONDS
                    self._move_out_of_range()
        except Exception:
            log.exception("fetch loop crashed")
            raise
        finally:
            self._run_commands()
            self._consumer.close()

    def _commits_here(self) -> bool:
        """Whether commits run on this thread (an application's ack waits for them)."""
        return self.classic or self._commit_consumer is None

    def _take(self, timeout: float) -> list[Message]:
        """The records librdkafka has for us: waits up to ``timeout`` for the first one
        only. consume(num, timeout) returns once it has ``num`` records or the timeout
        passed (librdkafka fills the batch), which held each record that arrived while the
        loop waited for up to the timeout (2 ms busy, 50 ms idle: at 1,000 records/s every
        record). poll() returns as the first arrives; consume(num, 0) then takes what else
        is queued without waiting."""
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        if self._batch == 1:
            return [first]
        return [first, *self._consumer.consume(self._batch - 1, 0)]

    def _serve_committer(self) -> None:
        """Serve the commit consumer's events (its log lines and errors are delivered by a
        poll; it has nothing to fetch) on the commit thread, without waiting for it."""
        assert self._commit_consumer is not None
        with contextlib.suppress(RuntimeError):  # the commit thread is shut down: stopping
            self._committer.submit(self._commit_consumer.poll, 0)

    def _run_commands(self) -> bool:
        """Run the queued commands; True if there were any."""
        ran = False
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return ran
            ran = True
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def _buffer(self, messages: list[Message]) -> None:
        """Buffer a consume() batch as one column chunk per partition run (runs.py)."""
        only = next(iter(self._topics)) if len(self._topics) == 1 else None
        runs, failed = runs_from_messages(messages, only)
        for msg in failed:
            error = msg.error()
            if error is None:
                continue
            if self._on_error is not None:
                self._on_error(error)
            if error.code() in _OUT_OF_RANGE_ERRORS and msg.topic() is not None:
                self._out_of_range(TP(str(msg.topic()), int(msg.partition() or 0)), msg.offset())
        added = False
        for run in runs:
            chunk = run.chunk
            tp = TP(run.topic, run.partition)
            self.on_consumed(run.topic, len(chunk), len(chunk.values) + len(chunk.keys))
            stamps = chunk.timestamps
            self.on_fetched(tp, self.last_poll, stamps[0] if stamps else -1)
            if self._table.append(tp, run.chunk):
                added = True
        if added:
            self._on_data()

    def _out_of_range(self, tp: TP, offset: int | None) -> None:
        """A partition's position is outside its log: it stopped fetching (librdkafka's
        ``auto.offset.reset=error``). Move it (now, or retried while Kafka cannot say
        where its log starts and ends)."""
        part = self._table.get(tp)
        if part is None or not part.ready or self.classic:
            return
        self._resets[tp] = offset if offset is not None and offset >= 0 else part.position
        self._resets_retry_at = 0.0
        self._move_out_of_range()

    def _move_out_of_range(self) -> None:
        """Fetch thread: each partition whose position fell outside its log goes on from
        the log start (records deleted before they were read: a gap), or from the log end
        when the log was truncated below the position or the configured reset says so."""
        for tp, offset in list(self._resets.items()):
            part = self._table.get(tp)
            if part is None or not part.ready or part.revoking:
                del self._resets[tp]
                continue
            ktp = TopicPartition(tp.topic, tp.partition)
            try:
                low, high = self._consumer.get_watermark_offsets(
                    ktp, timeout=WATERMARK_TIMEOUT_SECONDS, cached=False
                )
            except KafkaException as exc:
                log.warning("position out of range; log bounds unknown, retrying", error=str(exc))
                continue
            del self._resets[tp]
            if low <= offset <= high:
                target = offset  # in range again (a leader change): no gap
            elif offset > high or self.reset_to_end:
                target = high
            else:
                target = low
            if target > offset:
                self.on_gap(tp, offset, target, "retention" if offset < low else "reset")
            elif target < offset:
                self.on_gap(tp, target, offset, "truncated")
            if target < part.acks.next_offset:
                self._table.restart(part, target)  # offsets reused below what was delivered
            else:
                with self._table.lock:
                    part.position = target
            self._reassign(TopicPartition(tp.topic, tp.partition, target))

    def _holding(self) -> bool:
        """Leased mode, buffer full: hold consume() back for up to HOLD_SECONDS rather than
        pause every partition at once. pause() drops what librdkafka prefetched, and a
        resumed partition delivered again only after 300+ ms: under a backlog the buffer
        ran dry at every resume. Held back, librdkafka's own queue
        (``queued.max.messages.kbytes``) bounds its prefetching, and consumption goes on the
        moment a delivery makes room. Full for longer (a slow application), partitions are
        paused as before, so that consume() serves statistics (lag) and errors again.
        kafka_group mode never holds back: it must keep polling (``max.poll.interval.ms``)."""
        table = self._table
        if self.classic or table.buffered_bytes < table.hold_at:
            self._full_since = None
            table.holding = False
            return False
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        was = table.holding
        table.holding = fetch_backpressure.still_holding(self._full_since, now)
        if table.holding and not was:
            table.on_backpressure()
        return table.holding

    def _apply_backpressure(self) -> None:
        """Pause and resume partitions as :mod:`~services.consumer_sidecar.fetch_backpressure`
        decides."""
        table = self._table
        cap = table.per_partition_cap(fetch_backpressure.partition_share(self.classic))
        over_total = fetch_backpressure.over_total(
            classic=self.classic,
            buffered=table.buffered_bytes,
            leased_cap=table.leased_cap,
            hold_at=table.hold_at,
            full_since=self._full_since,
            holding=table.holding,
        )
        to_pause: list[TopicPartition] = []
        to_resume: list[TopicPartition] = []
        for part in table.snapshot():
            if part.suspended_at is not None or not part.ready:
                continue  # paused by the lease keeper, not by backpressure
            change = fetch_backpressure.pause_change(
                paused=part.paused, buffered=part.buffered_bytes, cap=cap, over_total=over_total
            )
            if change is None:
                continue
            part.paused = change
            (to_pause if change else to_resume).append(
                TopicPartition(part.tp.topic, part.tp.partition)
            )
        if to_pause:
            self._consumer.pause(to_pause)
            table.on_backpressure()
        if to_resume:
            self._consumer.resume(to_resume)
