"""Compatibility mode ``kafka_group`` (ARCHITECTURE §5.6): classic Kafka group consumption
behind the same StreamService.

In this mode the sidecar ``subscribe()``s to the group's topics with the cooperative-sticky
assignor and static membership (``group.instance.id`` = the sidecar id), and Kafka's group
coordinator decides which sidecar reads which partition. Everything else stays as in
leased mode: the same fetch loop polls continuously (so ``max.poll.interval.ms`` never
expires, whatever the application does), the same buffer and pause/resume backpressure,
the same Fetch/Ack/Status and the same ack tracker and committer. Partitions carry epoch 0
and no deadline: there is no lease, Kafka fences a stale member's commits by generation.

Kafka's rebalance callbacks run on the fetch thread, inside ``consume()``:

* ``on_assign`` → resolve each partition's start (the group's committed offset, else the
  earliest, as librdkafka would), ``incremental_assign`` at it, add a table entry;
* ``on_revoke`` (incremental with cooperative-sticky) → stop delivering, wait for in-flight
  acks up to the drain timeout, commit the ack tracker's commit point synchronously (still a
  member of the current generation; through the sidecar's committer, ``offset_commits.py``,
  with the fetch consumer), remove the entry;
* ``on_lost`` → the partitions may already be someone else's: drop without committing.

Each callback is also reported to :class:`RebalanceEvents` (the metrics): a rebalance
round's join (timed by :class:`~services.consumer_sidecar.round_timing.RoundTimer` from
``subscribe()`` or the revoke / loss that ended the previous round, until ``on_assign``),
the assignment's application (the closest this mode has to a SyncGroup time: librdkafka
answers JoinGroup and SyncGroup itself and calls the app once, with the result), and
per partition the lease-change metrics' grant / revoke / expire (= lost) with each
callback's handling time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import grpc
import grpc.aio
import structlog
from confluent_kafka import Consumer, KafkaException, TopicPartition

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc
from dsclient.connection import AioLeaderFollower, Backoff, CallPolicy
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.partitions import (
    NO_DEADLINE,
    UNLEASED_EPOCH,
    Partition,
    PartitionTable,
)
from services.consumer_sidecar.round_timing import RoundTimer
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)

# Nothing is consumed before the group's topics are known: ask for them until the assigner
# answers, whatever it answers meanwhile, backing off from 0.1 s to 5 s.
TOPICS_CALLS = CallPolicy(
    attempts=None, retry_codes=frozenset(grpc.StatusCode), backoff=Backoff(0.1, 5.0)
)

ASSIGNMENT_STRATEGY = "cooperative-sticky"
# Properties this mode sets itself; a group's consumer_config cannot override them.
_MODE_KEYS = frozenset(
    {
        "group.id",
        "group.instance.id",
        "group.protocol",
        "partition.assignment.strategy",
        "enable.auto.commit",
        "enable.auto.offset.store",
    }
)
DRAIN_POLL_SECONDS = 0.02


def classic_overrides(sidecar_id: str, group_config: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka overrides of a kafka_group consumer: the group's consumer_config, then
    what the mode needs (classic protocol, cooperative-sticky, static membership)."""
    overrides: dict[str, Any] = {k: v for k, v in group_config.items() if k not in _MODE_KEYS}
    if ignored := sorted(set(group_config) & _MODE_KEYS):
        log.warning("group consumer_config keys set by kafka_group mode are ignored", keys=ignored)
    overrides.update(
        {
            "group.protocol": "classic",
            "partition.assignment.strategy": ASSIGNMENT_STRATEGY,
            "group.instance.id": sidecar_id,
        }
    )
    return overrides


def unleased_partition(tp: TP, start: int) -> Partition:
    """A table entry for a partition Kafka assigned: epoch 0, never expires, ready at once.
    ``start`` < 0 means "not known": the first delivered record sets the commit point."""
    part = Partition(
        tp=tp,
        epoch=UNLEASED_EPOCH,
        deadline=NO_DEADLINE,
        acks=PartitionAcks(start),
        granted_at=time.monotonic(),
    )
    part.position = start
    part.committed = start
    part.ready = True
    return part


class RebalanceTarget(Protocol):
    """What the rebalance handlers need of the fetcher (they run on its thread)."""

    def assign(self, starts: dict[TP, int]) -> dict[TP, int]: ...


class RebalanceCommits(Protocol):
    """What the rebalance handlers need of the committer (offset_commits.py): a commit on
    the fetch thread, through the fetch consumer."""

    def commit_offsets(self, commits: list[tuple[TP, int]]) -> None: ...


class RebalanceEvents(Protocol):
    """What the rebalance callbacks report (the metrics; fetch thread)."""

    def joined(self, ok: bool, seconds: float | None) -> None: ...

    def synced(self, seconds: float) -> None: ...

    def lease_changed(self, kind: str) -> None: ...

    def lease_settled(self, kind: str, seconds: float) -> None: ...

    def partitions_lost(self, seconds: float) -> None: ...


class NoEvents:
    """Metrics disabled: nothing reported."""

    def joined(self, ok: bool, seconds: float | None) -> None:
        pass

    def synced(self, seconds: float) -> None:
        pass

    def lease_changed(self, kind: str) -> None:
        pass

    def lease_settled(self, kind: str, seconds: float) -> None:
        pass

    def partitions_lost(self, seconds: float) -> None:
        pass


class ClassicMembership:
    """Kafka's rebalance callbacks, mapped onto the partition table (fetch thread only)."""

    def __init__(
        self,
        table: PartitionTable,
        fetcher: RebalanceTarget,
        commits: RebalanceCommits,
        *,
        drain_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        events: RebalanceEvents | None = None,
    ) -> None:
        self.table = table
        self.fetcher = fetcher
        self.commits = commits
        self.drain_timeout = drain_timeout
        self.clock = clock
        self.sleep = sleep
        self.events: RebalanceEvents = events or NoEvents()
        self.rounds = RoundTimer(clock)

    def subscribing(self) -> None:
        """The consumer is about to subscribe(): its first round (JoinGroup) starts."""
        self.rounds.start()

    # ---- librdkafka callbacks (signature: consumer, partitions) -------------------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        entered = self.clock()
        joined = self.rounds.joined()
        tps = [TP(str(p.topic), int(p.partition or 0)) for p in partitions]
        ok = self._assign(consumer, partitions, tps)
        took = max(0.0, self.clock() - entered)
        self.events.joined(ok, joined)
        self.events.synced(took)
        for _tp in tps:
            self.events.lease_changed("grant")
            self.events.lease_settled("grant", took)

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition], tps: list[TP]) -> bool:
        """on_assign's work; False when the start offsets could not be read."""
        if not tps:
            return True  # confluent-kafka completes an empty incremental assignment itself
        ok = True
        # Registered (not ready) first: Fetcher.assign makes ready, and assigns in Kafka,
        # exactly the partitions the table holds.
        for tp in tps:
            part = unleased_partition(tp, -1)
            part.ready = False
            self.table.add(part)
        try:
            starts = self.fetcher.assign(dict.fromkeys(tps, -1))
        except KafkaException as exc:
            # The start offsets could not be read: let librdkafka start at the committed
            # offsets itself; the first delivered record then sets each commit point.
            log.warning("start offsets unknown; librdkafka resumes at the commits", error=str(exc))
            consumer.incremental_assign(partitions)
            starts = dict.fromkeys(tps, -1)
            for tp in tps:
                self.table.add(unleased_partition(tp, -1))
            ok = False
        for tp, start in starts.items():
            entry = self.table.get(tp)
            if entry is not None and not entry.ready:  # a fetcher that only assigns in Kafka
                self.table.add(unleased_partition(tp, start))
        log.info(
            "partitions assigned by Kafka",
            partitions=_names(starts),
            starts={f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(starts.items())},
        )
        return ok

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        entered = self.clock()
        self.rounds.start_unless_pending()  # the next round (on_assign) ends the rebalance
        tps = [TP(str(p.topic), int(p.partition or 0)) for p in partitions]
        self.release(tps, commit=True)
        log.info("partitions revoked by Kafka", partitions=_names(tps))
        took = max(0.0, self.clock() - entered)
        for _tp in tps:
            self.events.lease_changed("revoke")
            self.events.lease_settled("revoke", took)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        entered = self.clock()
        self.rounds.start_unless_pending()  # librdkafka rejoins: on_assign ends that round
        tps = [TP(str(p.topic), int(p.partition or 0)) for p in partitions]
        self.release(tps, commit=False)
        log.warning("partitions lost (membership expired): dropped", partitions=_names(tps))
        took = max(0.0, self.clock() - entered)
        self.events.joined(False, None)  # a failed rebalance: the membership was lost
        for _tp in tps:
            self.events.lease_changed("expire")
            self.events.partitions_lost(took)

    # ---- shared by the callbacks and the graceful drain ---------------------------------

    def release_all(self) -> None:
        """Graceful stop: hand back every partition with its acked offsets committed."""
        self.release([p.tp for p in self.table.snapshot()], commit=True)

    def release(self, tps: Iterable[TP], *, commit: bool) -> None:
        """Stop delivering ``tps``; if ``commit``, wait for in-flight acks (bounded) and
        commit each commit point synchronously; then forget them."""
        parts = [p for tp in tps if (p := self.table.get(tp)) is not None]
        for part in parts:
            part.revoking = True  # take() skips it from now on
            self.table.drop_buffer(part)
        if commit and parts:
            self._drain(parts)
            self._commit(parts)
        for part in parts:
            self.table.remove(part.tp)

    def _drain(self, parts: list[Partition]) -> None:
        deadline = self.clock() + self.drain_timeout
        while any(p.acks.inflight for p in parts) and self.clock() < deadline:
            self.sleep(DRAIN_POLL_SECONDS)
        for part in parts:
            if part.acks.inflight:
                log.warning(
                    "drain timeout: handing back with unacked records (they are redelivered)",
                    topic=part.tp.topic,
                    partition=part.tp.partition,
                    unacked=part.acks.inflight,
                )

    def _commit(self, parts: list[Partition]) -> None:
        commits = commit_points(parts)
        if not commits:
            return
        try:
            self.commits.commit_offsets(commits)
        except KafkaException as exc:
            # Fenced by Kafka (a newer generation) or Kafka unreachable: the next owner
            # resumes from the last successful commit; unacked-since records are redelivered.
            log.warning("commit on revoke failed", error=str(exc))
            return
        by_tp = dict(commits)
        for part in parts:
            if part.tp in by_tp:
                part.committed = by_tp[part.tp]


def commit_points(parts: Iterable[Partition]) -> list[tuple[TP, int]]:
    """(partition, offset) to commit: the ack tracker's commit point where it advanced."""
    out = []
    for part in parts:
        point = part.acks.commit_point
        if part.ready and point >= 0 and point > part.committed:
            out.append((part.tp, point))
    return out


def _names(tps: Iterable[TP]) -> list[str]:
    return [f"{tp.topic}[{tp.partition}]" for tp in sorted(tps)]


async def group_topics(assigner: AioLeaderFollower, group: str, timeout: float = 10.0) -> list[str]:
    """The group's topics, from the assigner's DescribeGroup (SessionAccepted names only the
    mode): asked of the leader until it answers, as :data:`TOPICS_CALLS` says."""
    request = admin_pb2.DescribeGroupRequest(group=group)
    response = await assigner.call(
        admin_pb2_grpc.AdminServiceStub,
        lambda stub: stub.DescribeGroup(request, timeout=timeout),
        TOPICS_CALLS,
        on_retry=_topics_not_read,
    )
    return list(response.config.topics)


def _topics_not_read(err: grpc.RpcError) -> None:
    log.warning(
        "kafka_group mode: cannot read the group's topics; retrying",
        code=err.code().name,
        error=err.details(),
    )
