"""Compatibility mode (``kafka_group``) without Kafka: config, rebalance callbacks on the
partition table, the commit guard, and the session's handling of the mode."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.assigner.v1 import assigner_pb2
from dataservice.common.v1 import common_pb2
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.kafka_group_membership import (
    ClassicMembership,
    classic_overrides,
    commit_points,
    unleased_partition,
)
from services.consumer_sidecar.kafka_group_mode import KafkaGroupMode
from services.consumer_sidecar.offset_commits import CommitRequest, OffsetCommitter
from services.consumer_sidecar.partitions import (
    NO_DEADLINE,
    UNLEASED_EPOCH,
    Partition,
    PartitionTable,
)
from services.consumer_sidecar.settings import SidecarSettings
from services.runtime.topic_partition import TP
from tests.support.classic_sessions import (
    Clock,
    FakeConsumer,
    FakeFetcher,
    chunk,
    deliver,
    kafka_tps,
    membership,
    record,
    session,
)

T = TP("t", 0)
U = TP("t", 1)


# ---- config -----------------------------------------------------------------------------


def test_overrides_force_cooperative_sticky_static_membership_and_classic_protocol() -> None:
    overrides = classic_overrides(
        "pod-7",
        {
            "session.timeout.ms": "6000",
            "fetch.max.bytes": "1048576",
            "group.id": "other",
            "group.instance.id": "x",
            "partition.assignment.strategy": "range",
            "group.protocol": "consumer",
            "enable.auto.commit": "true",
        },
    )
    assert overrides["partition.assignment.strategy"] == "cooperative-sticky"
    assert overrides["group.instance.id"] == "pod-7"
    assert overrides["group.protocol"] == "classic"
    assert overrides["session.timeout.ms"] == "6000"
    assert overrides["fetch.max.bytes"] == "1048576"
    assert "group.id" not in overrides
    assert "enable.auto.commit" not in overrides


def test_unleased_partition_has_epoch_zero_and_never_expires() -> None:
    part = unleased_partition(T, 42)
    assert part.epoch == UNLEASED_EPOCH == 0
    assert part.deadline == NO_DEADLINE and math.isfinite(NO_DEADLINE)
    assert part.live(1e9)
    assert part.ready and part.position == 42 and part.committed == 42
    assert part.acks.commit_point == 42


# ---- rebalance callbacks -------------------------------------------------------------------


def test_assign_adds_ready_partitions_at_the_resolved_start() -> None:
    m, _ = membership(FakeFetcher({T: 5, U: 0}))
    m.on_assign(FakeConsumer(), kafka_tps(T, U))  # type: ignore[arg-type]
    assert {p.tp: p.position for p in m.table.snapshot()} == {T: 5, U: 0}
    assert m.table.append(T, chunk(record(T, 5), record(T, 6)))
    taken = m.table.take(10, 1 << 20)
    assert [(r.offset, r.lease_epoch) for s in taken for r in s.to_records()] == [(5, 0), (6, 0)]


def test_assign_falls_back_to_librdkafka_committed_offsets() -> None:
    m, _ = membership(FakeFetcher(fail="assign"))
    consumer = FakeConsumer()
    m.on_assign(consumer, kafka_tps(T))  # type: ignore[arg-type]
    assert len(consumer.assigned) == 1  # librdkafka starts at the committed offset itself
    part = m.table.get(T)
    assert part is not None and part.ready
    assert commit_points([part]) == []  # nothing known, nothing delivered: nothing to commit
    deliver(m, T, [17, 18])
    part.acks.ack(17)
    assert commit_points([part]) == [(T, 18)]


def test_revoke_waits_for_inflight_acks_then_commits_and_forgets() -> None:
    fetcher = FakeFetcher({T: 0, U: 0})
    m, clock = membership(fetcher, drain=5.0)
    m.on_assign(FakeConsumer(), kafka_tps(T, U))  # type: ignore[arg-type]
    deliver(m, T, [0, 1, 2])
    part = m.table.get(T)
    assert part is not None
    part.acks.ack(0)
    # The application acks the rest while the revoke is draining.
    clock.on_sleep = lambda: [part.acks.ack(o) for o in (1, 2) if o >= part.acks.commit_point]
    m.on_revoke(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    assert fetcher.commits == [[(T, 3)]]
    assert m.table.get(T) is None
    assert m.table.get(U) is not None  # cooperative: only the revoked partition goes


def test_revoke_stops_delivery_at_once() -> None:
    m, _ = membership(FakeFetcher({T: 0}), drain=0.0)
    m.on_assign(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    assert m.table.append(T, chunk(record(T, 0)))
    part = m.table.get(T)
    assert part is not None
    m.release([T], commit=False)
    assert m.table.take(10, 1 << 20) == []
    assert m.table.buffered_bytes == 0


def test_drain_timeout_commits_the_lowest_unacked_offset() -> None:
    fetcher = FakeFetcher({T: 10})
    m, clock = membership(fetcher, drain=0.5)
    m.on_assign(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    deliver(m, T, [10, 11, 12, 13])
    part = m.table.get(T)
    assert part is not None
    part.acks.ack(10)
    part.acks.ack(12)
    start = clock.now
    m.on_revoke(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    assert clock.now - start >= 0.5
    assert fetcher.commits == [[(T, 11)]]  # 11 is redelivered by the next owner


def test_lost_partitions_are_dropped_without_commit() -> None:
    fetcher = FakeFetcher({T: 0})
    m, _ = membership(fetcher)
    m.on_assign(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    deliver(m, T, [0])
    m.table.partitions[T].acks.ack(0)
    m.on_lost(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    assert fetcher.commits == []
    assert m.table.get(T) is None


def test_a_fenced_commit_on_revoke_still_gives_the_partition_up() -> None:
    m, _ = membership(FakeFetcher({T: 0}, fail="commit"))
    m.on_assign(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    deliver(m, T, [0])
    m.table.partitions[T].acks.ack(0)
    m.on_revoke(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]  # must not raise
    assert m.table.get(T) is None


def test_release_all_commits_every_partition() -> None:
    fetcher = FakeFetcher({T: 0, U: 7})
    m, _ = membership(fetcher)
    m.on_assign(FakeConsumer(), kafka_tps(T, U))  # type: ignore[arg-type]
    deliver(m, T, [0, 1])
    m.table.partitions[T].acks.ack_all()
    m.release_all()
    assert fetcher.commits == [[(T, 2)]]  # U: nothing new to commit
    assert m.table.snapshot() == []


class SubscribingFetcher(FakeFetcher):
    """FakeFetcher plus what KafkaGroupMode drives: run() on the "fetch thread" at once,
    use_classic() recording what the consumer would subscribe with."""

    def __init__(self) -> None:
        super().__init__({T: 0})
        self.subscribed: list[tuple[dict[str, Any], list[str], ClassicMembership]] = []

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def use_classic(
        self, config: dict[str, Any], topics: list[str], membership: ClassicMembership
    ) -> None:
        self.subscribed.append((config, topics, membership))


def test_kafka_group_mode_subscribes_once_with_the_groups_config_and_releases() -> None:
    def on_stats(document: str) -> None: ...

    def on_error(error: KafkaError) -> None: ...

    async def main() -> None:
        fetcher = SubscribingFetcher()
        table = PartitionTable(64 * 1024 * 1024, time.monotonic)
        tasks: list[asyncio.Task[None]] = []
        asked: list[str] = []

        async def group_topics() -> list[str]:
            asked.append("DescribeGroup")
            return ["t", "u"]

        mode = KafkaGroupMode(
            table,
            fetcher,  # type: ignore[arg-type]
            fetcher,  # type: ignore[arg-type]  # its commits too
            SidecarSettings(group="g", id="sc-1", statistics_interval_ms=1000),
            on_stats=on_stats,
            on_error=on_error,
            group_topics=group_topics,
            spawn=lambda coro, name: tasks.append(asyncio.create_task(coro, name=name)),
        )
        accepted = assigner_pb2.SessionAccepted(
            consumer_config={"fetch.min.bytes": "1024", "group.id": "other"}
        )
        mode.on_accepted(accepted, kafka_group=False)  # a leased group: nothing to do
        assert not mode.active and not tasks
        mode.on_accepted(accepted, kafka_group=True)
        mode.on_accepted(accepted, kafka_group=True)  # a re-join: switched once only
        assert mode.active and len(tasks) == 1
        await tasks[0]
        ((config, topics, subscribed_as),) = fetcher.subscribed
        assert topics == ["t", "u"] and asked  # not in SessionAccepted: asked the assigner
        assert subscribed_as is mode.membership
        assert (config["group.id"], config["group.instance.id"]) == ("g", "sc-1")
        assert config["partition.assignment.strategy"] == "cooperative-sticky"
        assert config["fetch.min.bytes"] == "1024"  # the group's consumer_config
        assert config["queued.max.messages.kbytes"] == 8192  # the sidecar's own defaults
        assert config["statistics.interval.ms"] == 1000
        assert config["stats_cb"] is on_stats and config["error_cb"] is on_error
        # SIGTERM: every Kafka-assigned partition handed back with its acked offsets.
        assert subscribed_as is not None
        subscribed_as.on_assign(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
        deliver(subscribed_as, T, [0, 1, 2])
        table.partitions[T].acks.ack_all()
        await mode.release_all()
        assert fetcher.commits == [[(T, 3)]] and table.snapshot() == []

    asyncio.run(main())


class SwitchingFetcher(SubscribingFetcher):
    """Also records use_assign(): the switch back to an assign() consumer."""

    def __init__(self) -> None:
        super().__init__()
        self.assigned_with: list[tuple[dict[str, Any], ClassicMembership]] = []
        self.order: list[str] = []

    def use_classic(
        self, config: dict[str, Any], topics: list[str], membership: ClassicMembership
    ) -> None:
        self.order.append("subscribe")
        super().use_classic(config, topics, membership)

    def use_assign(self, config: dict[str, Any], membership: ClassicMembership) -> list[TP]:
        self.order.append("assign")
        self.assigned_with.append((config, membership))
        return []


def test_kafka_group_mode_switches_both_ways_at_runtime() -> None:
    async def main() -> None:
        fetcher = SwitchingFetcher()
        table = PartitionTable(64 * 1024 * 1024, time.monotonic)
        tasks: list[asyncio.Task[None]] = []

        async def drop_leases() -> None:
            fetcher.order.append("drop leases")

        async def no_topics() -> list[str]:
            raise AssertionError("the topics come with SessionAccepted")

        mode = KafkaGroupMode(
            table,
            fetcher,  # type: ignore[arg-type]
            fetcher,  # type: ignore[arg-type]  # its commits too
            SidecarSettings(group="g", id="sc-1"),
            on_stats=lambda _doc: None,
            on_error=lambda _err: None,
            group_topics=no_topics,
            spawn=lambda coro, name: tasks.append(asyncio.create_task(coro, name=name)),
            drop_leases=drop_leases,
        )
        accepted = assigner_pb2.SessionAccepted(topics=["t"])
        mode.on_accepted(accepted, kafka_group=True)
        subscribed = mode.membership
        mode.on_accepted(accepted, kafka_group=False)  # switched back before it was done
        assert not mode.active
        await asyncio.gather(*tasks)
        assert fetcher.order == ["drop leases", "subscribe", "assign"], "in the asked order"
        ((config, membership),) = fetcher.assigned_with
        assert membership is subscribed
        assert "group.instance.id" not in config and config["group.id"] == "g"
        mode.on_accepted(accepted, kafka_group=True)  # and again
        await asyncio.gather(*tasks)
        assert mode.active and fetcher.order[-1] == "subscribe"

    asyncio.run(main())


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=60),
    acked=st.sets(st.integers(min_value=0, max_value=59)),
    start=st.integers(min_value=0, max_value=1000),
)
def test_revoke_commits_exactly_the_lowest_unacked(count: int, acked: set[int], start: int) -> None:
    fetcher = FakeFetcher({T: start})
    m, _ = membership(fetcher, drain=0.1)
    m.on_assign(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    offsets = [start + i for i in range(count)]
    deliver(m, T, offsets)
    part = m.table.partitions[T]
    for i in sorted(acked):
        if i < count:
            part.acks.ack(start + i)
    m.on_revoke(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    unacked = [start + i for i in range(count) if i not in acked]
    expected = unacked[0] if unacked else start + count
    assert fetcher.commits == ([[(T, expected)]] if expected > start else [])


# ---- the commit guard in the committer ---------------------------------------------------


def committer_with(
    table: PartitionTable, consumer: FakeConsumer, *, classic: bool = False
) -> OffsetCommitter:
    """The committer of a fetch loop over ``consumer`` (kafka_group mode with ``classic``)."""
    commits = OffsetCommitter(table, sidecar_id="s")
    fetcher = Fetcher(consumer, table, commits, batch=10, on_data=lambda: None)  # type: ignore[arg-type]
    fetcher.classic = classic
    return commits


def test_commits_for_partitions_no_longer_held_are_dropped() -> None:
    clock = Clock()
    table = PartitionTable(1 << 26, clock)
    consumer = FakeConsumer()
    commits = committer_with(table, consumer)
    table.add(unleased_partition(T, 0))
    commits.commit([CommitRequest(T, 5, 0), CommitRequest(U, 5, 0), CommitRequest(T, 6, 3)])
    assert [(tp.partition, tp.offset) for tp in consumer.commits[0]] == [(0, 5)]
    assert '"epoch":0' in str(consumer.commits[0][0].metadata)


def test_a_commit_whose_lease_lapsed_while_queued_is_not_sent() -> None:
    # The asyncio side checked the lease, then the process was paused (SIGSTOP) before the
    # fetch thread's turn: on waking, the deadline has passed and the partition may be
    # another sidecar's, whose commits Kafka would not protect from ours.
    clock = Clock()
    table = PartitionTable(1 << 26, clock)
    consumer = FakeConsumer()
    commits = committer_with(table, consumer)
    table.add(Partition(tp=T, epoch=2, deadline=clock.now + 3, acks=PartitionAcks(0)))
    table.add(Partition(tp=U, epoch=2, deadline=clock.now + 30, acks=PartitionAcks(0)))
    first = CommitRequest(T, 5, 2)
    assert commits.commit([first]) == [first]
    clock.now += 4  # paused past T's deadline, not U's
    late, other = CommitRequest(T, 9, 2), CommitRequest(U, 7, 2)
    assert commits.commit([late, other]) == [other]
    assert [[(tp.partition, tp.offset) for tp in c] for c in consumer.commits] == [
        [(0, 5)],
        [(1, 7)],
    ]


def test_kafka_group_mode_never_commits_below_a_reassigned_partitions_start() -> None:
    clock = Clock()
    table = PartitionTable(1 << 26, clock)
    consumer = FakeConsumer()
    commits = committer_with(table, consumer, classic=True)
    table.add(unleased_partition(T, 50))  # handed back to us at committed offset 50
    commits.commit_offsets([(T, 40)])  # queued before the revoke: stale
    assert consumer.commits == []
    commits.commit_offsets([(T, 55)])
    assert [tp.offset for tp in consumer.commits[0]] == [55]


# ---- the session in kafka_group mode -------------------------------------------------------


def accepted(mode: Any) -> assigner_pb2.SessionResponse:
    return assigner_pb2.SessionResponse(
        accepted=assigner_pb2.SessionAccepted(session_id="x", mode=mode)
    )


def test_session_learns_kafka_group_mode_and_holds_grants_only_on_paper() -> None:
    async def scenario() -> None:
        client, seen = session()
        client.keeper.table.add(unleased_partition(T, 3))  # a Kafka-assigned partition
        await client._handle(accepted(common_pb2.GROUP_MODE_KAFKA_GROUP))
        assert client.kafka_group and len(seen) == 1
        grant = assigner_pb2.LeaseGrant(topic="t", partition=1, epoch=4, start_offset=-1)
        await client._handle(assigner_pb2.SessionResponse(grant=grant))
        # Nothing fetched for the grant: the table holds only what Kafka assigned.
        assert [p.tp for p in client.keeper.table.snapshot()] == [T]
        hb = client._heartbeat().heartbeat
        assert [(x.partition, x.epoch) for x in hb.leases] == [(1, 4)]
        join = client._join().join
        assert [(x.partition, x.epoch) for x in join.held_leases] == [(1, 4)]  # never T
        revoke = assigner_pb2.LeaseRevoke(topic="t", partition=1, epoch=4)
        await client._handle(assigner_pb2.SessionResponse(revoke=revoke))
        hb = client._heartbeat().heartbeat
        assert list(hb.leases) == []
        assert [(x.partition, x.epoch, x.committed_offset) for x in hb.released_leases] == [
            (1, 4, -1)
        ]
        # A re-join in another mode switches the running sidecar (UpdateGroup's mode
        # switch ends the session); the consumer's part is on_accepted's.
        await client._handle(accepted(common_pb2.GROUP_MODE_LEASED))
        assert not client.kafka_group and len(seen) == 2
        join = client._join().join
        assert list(join.held_leases) == [], "a Kafka-assigned partition is never a lease"

    asyncio.run(scenario())


def test_session_defaults_to_leased_mode() -> None:
    async def scenario() -> None:
        client, _ = session()
        await client._handle(accepted(common_pb2.GROUP_MODE_UNSPECIFIED))
        assert client.mode == common_pb2.GROUP_MODE_LEASED and not client.kafka_group

    asyncio.run(scenario())


def test_leave_in_kafka_group_mode_releases_nominal_leases_not_kafka_partitions() -> None:
    async def scenario() -> None:
        client, _ = session()
        client.keeper.table.add(unleased_partition(T, 3))
        await client._handle(accepted(common_pb2.GROUP_MODE_KAFKA_GROUP))
        client.connected = False  # no assigner to call
        grant = assigner_pb2.LeaseGrant(topic="t", partition=1, epoch=2)
        await client._handle(assigner_pb2.SessionResponse(grant=grant))
        await client.leave(timeout=0.1)
        assert client.keeper.table.get(T) is not None  # the app's classic drain owns it
        hb = client._heartbeat().heartbeat
        assert [(x.partition, x.epoch) for x in hb.released_leases] == [(1, 2)]

    asyncio.run(scenario())


def test_status_duration_of_an_unleased_partition_is_representable() -> None:
    # rpc.Status turns deadline - now into a Duration: it must stay finite and in range.
    from google.protobuf import duration_pb2

    d = duration_pb2.Duration()
    d.FromNanoseconds(int(max(0.0, NO_DEADLINE - 12345.0) * 1e9))
    assert 0 < d.seconds < 315_576_000_000


class RebalancingConsumer(FakeConsumer):
    def __init__(self) -> None:
        super().__init__()
        self.rebalancing = True

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        if self.rebalancing:
            raise KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS))
        return super().commit(offsets, asynchronous)


def test_kafka_group_commits_refused_mid_rebalance_are_retried_after_it() -> None:
    table = PartitionTable(1 << 26, Clock())
    consumer = RebalancingConsumer()
    commits = committer_with(table, consumer, classic=True)
    table.add(unleased_partition(T, 0))
    table.add(unleased_partition(U, 0))
    commits.commit_offsets([(T, 5), (U, 3)])  # not an error: the ack stays accepted
    table.remove(U)  # revoked meanwhile: its revoke callback committed it
    consumer.rebalancing = False
    commits.retry_deferred()
    assert [(tp.partition, tp.offset) for tp in consumer.commits[0]] == [(0, 5)]


def test_leased_mode_commit_errors_are_raised() -> None:
    table = PartitionTable(1 << 26, Clock())
    commits = committer_with(table, RebalancingConsumer())
    table.add(unleased_partition(T, 0))
    with pytest.raises(KafkaException):
        commits.commit([CommitRequest(T, 5, 0)])
