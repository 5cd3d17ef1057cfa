"""Where the sidecar's offset commits go to Kafka: one committer for both modes.

Everything above it (the lease commit path, :mod:`~services.consumer_sidecar.lease_commits`;
kafka_group mode's revoke commits, :mod:`~services.consumer_sidecar.kafka_group_membership`)
hands it :class:`CommitRequest` s; it checks each against the partition table at the last
moment, picks the way out, and says which were committed.

* Leased mode: through a second consumer of the group, on a commit thread of its own
  (``kafka-commit``, :meth:`OffsetCommitter.commit_async`), so a commit neither waits for
  the fetch loop's consume() in progress nor stops fetching for its round trip. A group
  without members (leased mode never subscribes) takes commits from any consumer of it.
* ``commit_fencing: kafka``: each lease granted under it commits in its own transaction,
  through its lease producer (:mod:`~services.consumer_sidecar.kafka_fenced_commits`),
  whose id is initialised on the fetch thread at the grant, before the start offset is
  read (:meth:`OffsetCommitter.open_leases`); a lease Kafka fenced is handed on
  (:attr:`CommitEvents.on_fenced`).
* kafka_group mode (or without a commit consumer): on the fetch thread, through the fetch
  consumer, where commits interleave with the rebalance callbacks consume() runs. A commit
  refused because the group is rebalancing is deferred and retried between polls
  (:meth:`OffsetCommitter.between_polls`).
* Leased mode, before a commit: the committed offsets are read back (at most once per
  interval) so that a commit never overwrites an external one it could have seen
  (issue 23, :meth:`OffsetCommitter.check_external`).

The fetch loop (:mod:`~services.consumer_sidecar.fetcher`) hands the committer what it needs
of the fetch thread (:class:`FetchThread`) and calls it between polls; the committer never
imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from services.consumer_sidecar.events import CommitEvents
from services.consumer_sidecar.kafka_fenced_commits import FencedCommitter
from services.consumer_sidecar.partitions import UNLEASED_EPOCH, PartitionTable, Reverted
from services.runtime import commitmeta
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)
R = TypeVar("R")

DEFERRED_COMMIT_RETRY_SECONDS = 0.2
COMMITTER_SERVE_SECONDS = 1.0
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


class FetchThread(Protocol):
    """What the committer needs of the fetch loop (``Fetcher``): its mode, its consumer
    (commits on the fetch thread go through it) and a way onto its thread."""

    @property
    def classic(self) -> bool: ...

    @property
    def consumer(self) -> Consumer: ...

    async def run(self, fn: Callable[..., R], *args: Any) -> R: ...


class OffsetCommitter:
    def __init__(
        self,
        table: PartitionTable,
        *,
        sidecar_id: str,
        consumer: Consumer | None = None,
        fenced: FencedCommitter | None = None,
        external_check_seconds: float = 0.5,
        events: CommitEvents | None = None,
    ) -> None:
        """``consumer``: leased mode's commit consumer (None: commits go through the fetch
        consumer, on the fetch thread); ``fenced``: the lease producers of
        ``commit_fencing: kafka``; ``events``: what it reports."""
        self._table = table
        self._sidecar_id = sidecar_id
        self._commit_consumer = consumer
        self._fetch: FetchThread | None = None  # the fetch loop's, once it is made
        # Leased mode's commits, when a commit consumer is given: an application's ack
        # waits for its commit, and on the fetch thread a commit first waited for the
        # consume() in progress and then held fetching up for its round trip (half of a
        # Fetch+ack cycle's time in the benchmark). confluent-kafka serializes the calls on
        # one handle, hence a consumer of its own.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-commit")
        # commit_fencing: kafka: the lease producers that make (and fence) the commits of
        # the leases granted under it (Partition.kafka_fenced); the others (and all, when
        # None) commit through a consumer, fenced by the local deadlines.
        self.fenced = fenced
        # The group's external_offset_changes (issue 23): follow | revert | ignore.
        self.external_changes = "follow"
        # When each partition's committed offset was last read back (monotonic): before a
        # commit it is read back again only if that is older than this (see
        # _without_external), so the ack path pays the round trip at most once per interval.
        self.external_check_seconds = external_check_seconds
        self._read_back: dict[TP, float] = {}
        self._deferred: dict[TP, CommitRequest] = {}  # kafka_group: refused mid-rebalance
        self._deferred_retry_at = 0.0
        self._serve_at = 0.0
        self._events = events or CommitEvents()

    def attach(self, fetch: FetchThread) -> None:
        """The fetch loop this committer commits on in kafka_group mode (its own)."""
        self._fetch = fetch

    @property
    def _fetch_loop(self) -> FetchThread:
        assert self._fetch is not None, "no fetch loop attached"
        return self._fetch

    @property
    def _classic(self) -> bool:
        return self._fetch is not None and self._fetch.classic

    def stop(self) -> None:
        """Wait for the commit in progress, then close the commit consumer and the lease
        producers."""
        self._thread.shutdown(wait=True)
        if self._commit_consumer is not None:
            self._commit_consumer.close()
        if self.fenced is not None:
            self.fenced.close_all()

    # ---- the fetch thread's side --------------------------------------------------------

    @property
    def on_fetch_thread(self) -> bool:
        """Whether commits run on the fetch thread (an application's ack waits for them)."""
        return self._classic or self._commit_consumer is None

    @property
    def deferred(self) -> bool:
        """kafka_group mode: commits refused mid-rebalance wait to be retried."""
        return bool(self._deferred)

    def between_polls(self, now: float) -> None:
        """Fetch thread, after each poll: serve the commit consumer now and then, and retry
        the commits a rebalance deferred."""
        if self._commit_consumer is not None and now >= self._serve_at:
            self._serve_at = now + COMMITTER_SERVE_SECONDS
            self._serve_committer()
        if self._deferred and now >= self._deferred_retry_at:
            self._deferred_retry_at = now + DEFERRED_COMMIT_RETRY_SECONDS
            self.retry_deferred()

    def _serve_committer(self) -> None:
        """Serve the commit consumer's events (its log lines and errors are delivered by a
        poll; it has nothing to fetch) on the commit thread, without waiting for it."""
        assert self._commit_consumer is not None
        with contextlib.suppress(RuntimeError):  # the commit thread is shut down: stopping
            self._thread.submit(self._commit_consumer.poll, 0)

    def forget_deferred(self) -> None:
        """Fetch thread: the partitions were handed back to Kafka (committed, or left)."""
        self._deferred.clear()

    def open_leases(self, starts: dict[TP, int]) -> None:
        """Fetch thread, commit_fencing: kafka: initialise each granted lease's
        transactional id before its start offset is read (fencing the previous holder;
        kafka_fenced_commits.py). One that fails is not started (a retriable error is
        retried by the caller)."""
        if self.fenced is None or self._classic:
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

    def close_lease(self, tp: TP) -> None:
        """Fetch thread: a partition given up ends its lease producer (commit_fencing:
        kafka); one still held (a regrant under a new epoch) keeps it."""
        part = self._table.get(tp)
        if self.fenced is not None and (part is None or part.revoking):
            self.fenced.close(tp)

    # ---- commits ------------------------------------------------------------------------

    async def commit_async(self, requests: list[CommitRequest]) -> list[CommitRequest]:
        """:meth:`commit` off the event loop. Leased mode: through the commit consumer on the
        commit thread, so the commit neither waits for the consume() in progress nor stops
        fetching for its round trip (the lease checks are made there, right before it, as
        on the fetch thread). kafka_group mode (or without a commit consumer): on the fetch
        thread, where commits interleave with the rebalance callbacks that consume() runs."""
        if self.on_fetch_thread:
            return await self._fetch_loop.run(self.commit, requests)
        future = self._thread.submit(self.commit, requests, self._commit_consumer)
        return await asyncio.wrap_future(future)

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
        if not self._classic and self.external_changes != "ignore":
            kept = self._without_external(kept, consumer or self._fetch_loop.consumer)
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
        if self.fenced is not None and not self._classic:
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
            result = (consumer or self._fetch_loop.consumer).commit(
                offsets=offsets, asynchronous=False
            )
        except KafkaException as exc:
            self._events.on_commit_request(False, time.monotonic() - started)
            if self._defer_if_rebalancing(exc, kept):
                return []
            raise
        failed = [
            (r, tp.error) for r, tp in zip(kept, result or [], strict=False) if tp.error is not None
        ]
        self._events.on_commit_request(not failed, time.monotonic() - started)
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
        fenced is handed to :attr:`CommitEvents.on_fenced` (it is over here) and left out of
        what is returned; a retriable failure raises once the others are done."""
        assert self.fenced is not None
        result = self.fenced.commit((r.tp, r.epoch, o) for r, o in zip(kept, offsets, strict=True))
        ok = not (result.fenced or result.failed)
        self._events.on_commit_request(ok, time.monotonic() - started)
        for fenced in result.fenced:
            with self._table.lock:
                part = self._table.partitions.get(fenced.tp)
                if part is not None and part.epoch == fenced.epoch:
                    part.revoking = True  # nothing more of it is delivered or committed
            self._events.on_fenced(fenced)
        if result.failed:
            raise next(iter(result.failed.values()))
        done = set(result.committed)
        return [r for r in kept if r.tp in done]

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

    def _still_committable(self, request: CommitRequest, now: float) -> bool:
        part = self._table.get(request.tp)
        if part is None or part.epoch != request.epoch or not part.live(now):
            return False
        if part.external is not None:
            return False  # an external commit is being followed: never overwrite it
        return not self._classic or request.offset >= part.committed

    # ---- kafka_group mode: commits refused mid-rebalance ------------------------------------

    def _defer_if_rebalancing(self, exc: KafkaException, requests: list[CommitRequest]) -> bool:
        """kafka_group mode: a commit refused because a rebalance is under way (the member's
        generation is changing) is not a failure of the sidecar. It is retried on the fetch
        thread once the rebalance completes (:meth:`retry_deferred`); a partition revoked
        meanwhile has been committed by the revoke callback, one lost is dropped."""
        error = exc.args[0] if exc.args else None
        if not (self._classic and isinstance(error, KafkaError)):
            return False
        if error.code() not in _REBALANCE_COMMIT_ERRORS:
            return False
        for request in requests:
            self._deferred[request.tp] = request
        return True

    def retry_deferred(self) -> None:
        """Fetch thread: the commits a rebalance deferred, again (those still held)."""
        deferred, self._deferred = self._deferred, {}
        now = self._table.clock()
        requests = [r for r in deferred.values() if self._still_committable(r, now)]
        if not requests:
            return
        try:
            self.commit(requests)
        except KafkaException as exc:
            log.warning("deferred commit failed", error=str(exc))

    # ---- external commits (issue 23) --------------------------------------------------------

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

    async def check_external_async(self, tps: list[TP]) -> list[TP]:
        """:meth:`check_external` on the commit thread (the fetch thread without one)."""
        if self._commit_consumer is None:
            return await self._fetch_loop.run(self.check_external, tps)
        future = self._thread.submit(self.check_external, tps, self._commit_consumer)
        return await asyncio.wrap_future(future)

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
        consumer = consumer or self._commit_consumer or self._fetch_loop.consumer
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
