"""The commit path of the sidecar's leases: batched ack commits, commit on ack, explicit
commits, a revoke's final commit, and the check for commits this sidecar did not make.

* Commits are batched (every interval, or early after many acks), carry the epoch in their
  metadata, and are refused for a partition whose local lease deadline has passed. An ack
  is answered accepted only once a commit covering it is durable in Kafka
  (:meth:`LeaseCommitter.commit_acked`); an ack that cannot be (the lease lapsed, the
  commit was dropped) is refused, and its records come again.
* The commit loop also suspends lapsed leases at their local deadline (the lease keeper's
  ``suspend_expired``, :mod:`leasing`); idle (nothing acked, no lease deadline), it sleeps
  until an ack or a commit asked for.
* A revoke's final commit that Kafka refuses is reported (COMMIT_FAILED) and retried while
  the lease lasts (:meth:`LeaseCommitter.final_commit`).
* A sidecar that was itself away long enough for its Kafka-fenced leases to move
  (stall_watch.py) delivers nothing of them until a commit made after it woke up has
  succeeded (:meth:`LeaseCommitter.commit_all` verifies them) or been fenced.
* Explicit commits (``CommitOffsets``, Spark's batch commit) are fenced by the caller's
  lease epoch too. They are authoritative when made: ``Partition.committed`` becomes the
  committed offset, and the ack-driven committer only ever commits an ack point *above*
  ``Partition.committed``, so it never moves the group backwards behind them.
* External commits (issue 23): each commit checks the partitions it commits; a sweep
  every interval checks the others, and each newly found one is reported once.

The commits themselves go out through the sidecar's one committer
(:meth:`OffsetCommitter.commit_async`, :mod:`~services.consumer_sidecar.offset_commits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from confluent_kafka import KafkaException

from dataservice.sidecar.v1 import stream_pb2
from dsclient.reasons import DsError, Reason
from services.consumer_sidecar.events import LeaseCommitEvents
from services.consumer_sidecar.idle_waits import commit_wait
from services.consumer_sidecar.lease_checks import Problem, lease_problem
from services.consumer_sidecar.offset_commits import CommitRequest, OffsetCommitter
from services.consumer_sidecar.partitions import (
    UNLEASED_EPOCH,
    Partition,
    PartitionTable,
    Reverted,
)
from services.consumer_sidecar.wakeup import bring_forward
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)

FINAL_COMMIT_BACKOFF = (0.1, 1.0)  # a revoke's failed final commit: retry from, up to


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


class LeaseCommitter:
    def __init__(
        self,
        table: PartitionTable,
        commits: OffsetCommitter,
        *,
        commit_interval: float,
        commit_max_acks: int,
        commit_on_ack: bool = True,
        suspend_expired: Callable[[], Awaitable[None]],
        next_lease_deadline: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
        events: LeaseCommitEvents | None = None,
    ) -> None:
        self.table = table
        self._events = events or LeaseCommitEvents()
        self.commits = commits
        self.commit_interval = commit_interval
        self.commit_max_acks = commit_max_acks
        self.commit_on_ack = commit_on_ack
        self.clock = clock
        # The lease keeper's (leasing.py): each commit round suspends the leases whose
        # local deadline passed; the earliest such deadline ends an idle loop's sleep.
        self.suspend_expired = suspend_expired
        self._next_lease_deadline = next_lease_deadline
        self._acks_since_commit = 0
        self._commit_now = asyncio.Event()
        # Issue 34: the commit loop sleeps until a deadline it knows of, or with none
        # until an ack (the loop is idle: ``_commits_idle``) gives it one.
        self._commits_idle = False
        # The idle loop's wait: an ack that its answer commits (commit on ack) gives it a
        # deadline one interval away instead of waking it (``uncommitted``).
        self._wait: asyncio.Timeout | None = None
        self._commit_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # the commit loop's
        table.on_stalled = self._stalled

    def wake_if_idle(self) -> None:
        """A lease got a new local deadline: an idle loop wakes to suspend it at that
        deadline, should it lapse."""
        if self._commits_idle:
            self._commit_now.set()

    def uncommitted(self, answered: bool = False) -> None:
        """Something changed that the next commit round must carry: it comes within the
        commit interval, or at once after many acks or when the loop was idle.
        ``answered``: acks whose answer commits them (:meth:`commit_acked`, commit on
        ack): an idle loop is not woken for them, it looks once within the interval (so
        an ack whose own commit failed is still committed). Before, every ack woke it for
        a second round that found nothing to commit (issue 34: a loop wake and a scan of
        the table at every batch)."""
        self._acks_since_commit += 1
        if self._acks_since_commit >= self.commit_max_acks:
            self._commit_now.set()
        elif self._commits_idle:
            in_time = asyncio.get_running_loop().time() + self.commit_interval
            if not (answered and self.commit_on_ack and bring_forward(self._wait, in_time)):
                self._commit_now.set()

    async def commit_loop(self) -> None:
        """Commit rounds: every ``commit_interval`` while acks come, at once when asked;
        and lapsed leases suspended at their local deadline. Idle (nothing acked, no lease
        deadline), the loop sleeps until an ack or a commit asked for."""
        self._loop = asyncio.get_running_loop()
        retry = self._unverified_waiting()  # a stall seen before the loop ran
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
                async with asyncio.timeout(wait) as self._wait:
                    await self._commit_now.wait()
            self._wait = None
            self._commits_idle = False
            self._commit_now.clear()
            self._acks_since_commit = 0
            retry = False
            try:
                await self.commit_all()
                self._events.on_commit(None)
                await self.suspend_expired()
                retry = self._unverified_waiting()
            except Exception as exc:
                log.warning("commit failed; will retry", error=str(exc))
                self._events.on_commit(exc)
                retry = True

    def _unverified_waiting(self) -> bool:
        """A lease a stall left unverified that this round could not commit (its fetching
        not set up yet, or its grant not confirmed yet): the loop looks again after an
        interval rather than sleeping until an ack that cannot come (nothing of it is
        delivered meanwhile). Not one following an external commit (it commits nothing
        until its lease ends)."""
        return any(
            p.unverified and not p.revoking and p.external is None for p in self.table.snapshot()
        )

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
            await self.commit_all(unless_covered=touched)
        except KafkaException as exc:
            raise DsError(
                Reason.KAFKA_UNAVAILABLE,
                f"acks recorded but not committed yet ({exc}); retry the ack",
            ) from exc
        failed: dict[TP, Problem] = {}
        now = self.clock()
        for tp, (part, version) in touched.items():
            if _covers(part, version):
                continue
            problem = lease_problem(part, now, part.epoch)
            failed[tp] = problem or (
                stream_pb2.REJECT_REASON_COMMIT_FAILED,
                "the acks were not committed (the lease was given up before the commit was "
                "sent); the records will be redelivered",
            )
        return failed

    async def commit_all(
        self, unless_covered: dict[TP, tuple[Partition, int]] | None = None
    ) -> None:
        """Commit what is acked and not committed, of every partition held.
        ``unless_covered``: acks (each partition with its acks' version) whose commit is
        all the caller waits for: once a commit made while it waited for the lock covers
        them, it returns without one of its own. Acks that come faster than commits then
        share them instead of queueing a commit each behind the lock (each waiter's commit
        took the acks that came meanwhile, so each made one: a queue that grew while acks
        came faster than a commit's round trip)."""
        async with self._commit_lock:
            if unless_covered and all(_covers(p, v) for p, v in unless_covered.values()):
                return
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
            sent = await self.commits.commit_async(requests)
            self._announce_external()
            done = {id(r) for r in sent}  # a request the committer dropped stays pending
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
                self._events.on_verified()  # wake the Fetches and Streams waiting for its records

    async def external_check_loop(self, interval: float) -> None:
        """Issue 23: every ``interval``, one OffsetFetch for all held partitions, to notice
        a commit this sidecar did not make on a partition nobody acks (the commits check
        the partitions they commit themselves, right before committing)."""
        while True:
            await asyncio.sleep(interval)
            if self.commits.external_changes == "ignore":
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
                await self.commits.check_external_async(tps)
        self._announce_external()

    def _announce_external(self) -> None:
        """Log each newly flagged or reverted external commit once and have the session
        report it."""
        fresh = [
            p for p in self.table.snapshot() if p.external is not None and not p.external_announced
        ]
        if any(p.reverted for p in self.table.snapshot()):
            self._events.on_external()
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
        self._events.on_external()

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
        in one Kafka commit. Outcomes in the order of ``commits``."""
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
                    sent = await self.commits.commit_async(requests)
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

    async def final_commit(self, part: Partition) -> int:
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
                self._events.on_commit(exc)
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
                self._events.on_commit(None)
            return committed

    async def _commit_partition(self, part: Partition) -> int:
        async with self._commit_lock:
            point, acked, version = self.table.commit_view(part)
            moved = point > part.committed or (
                point == part.committed and version != part.committed_version
            )
            if part.ready and moved and part.live(self.clock()):
                request = CommitRequest(part.tp, point, part.epoch, acked)
                if await self.commits.commit_async([request]):
                    part.committed = point
                    part.committed_version = version
            return part.committed


def _covers(part: Partition, version: int) -> bool:
    """A commit made covers the partition's acks up to ``version`` (its acks' version then)."""
    return part.committed_version >= version
