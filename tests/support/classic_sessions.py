"""The classic (Kafka group) mode's unit-test helpers: a sidecar session over a scripted group
consumer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dataservice.assigner.v1 import assigner_pb2
from dataservice.common.v1 import common_pb2
from dsclient.records.batches import Chunk, chunk_from_records
from services.consumer_sidecar.events import SessionEvents
from services.consumer_sidecar.kafka_group_membership import (
    ClassicMembership,
)
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.partitions import (
    PartitionTable,
)
from services.consumer_sidecar.session import SessionClient, SessionIdentity
from services.runtime.topic_partition import TP


def record(tp: TP, offset: int) -> common_pb2.Record:
    return common_pb2.Record(topic=tp.topic, partition=tp.partition, offset=offset, value=b"v")


def chunk(*records: common_pb2.Record) -> Chunk:
    return chunk_from_records(records)


class FakeFetcher:
    """The fetch-thread side the rebalance handlers use: the fetcher's assign() and the
    committer's commit_offsets()."""

    def __init__(self, starts: dict[TP, int] | None = None, fail: str = "") -> None:
        self.starts = starts or {}
        self.fail = fail
        self.commits: list[list[tuple[TP, int]]] = []

    def assign(self, starts: dict[TP, int]) -> dict[TP, int]:
        if self.fail == "assign":
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return {tp: self.starts.get(tp, 0) for tp in starts}

    def commit_offsets(self, commits: list[tuple[TP, int]]) -> None:
        if self.fail == "commit":
            raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION))
        self.commits.append(commits)


class FakeConsumer:
    def __init__(self) -> None:
        self.assigned: list[list[TopicPartition]] = []
        self.commits: list[list[TopicPartition]] = []

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.append(partitions)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        self.commits.append(offsets)
        return offsets

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        """OffsetFetch: each partition's last commit here (-1001: none), as Kafka answers."""
        last = {(tp.topic, tp.partition): tp for batch in self.commits for tp in batch}
        return [
            last.get((tp.topic, tp.partition), TopicPartition(tp.topic, tp.partition, -1001))
            for tp in partitions
        ]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.on_sleep: Callable[[], None] = lambda: None

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep()


def membership(fetcher: FakeFetcher, drain: float = 1.0) -> tuple[ClassicMembership, Clock]:
    clock = Clock()
    table = PartitionTable(64 * 1024 * 1024, clock)
    return (
        ClassicMembership(
            table, fetcher, fetcher, drain_timeout=drain, clock=clock, sleep=clock.sleep
        ),
        clock,
    )


def kafka_tps(*tps: TP) -> list[TopicPartition]:
    return [TopicPartition(tp.topic, tp.partition) for tp in tps]


def deliver(m: ClassicMembership, tp: TP, offsets: list[int]) -> None:
    assert m.table.append(tp, chunk(*(record(tp, o) for o in offsets)))
    taken = m.table.take(10_000, 64 * 1024 * 1024)
    assert [o for s in taken if TP(s.topic, s.partition) == tp for o in s.offsets] == offsets


def session(
    events: SessionEvents | None = None,
) -> tuple[SessionClient, list[assigner_pb2.SessionAccepted]]:
    """A session over a keeper that never fetches nor commits; every SessionAccepted it
    handles is kept (``events``: the others, as a test listens to them)."""
    clock = Clock()
    table = PartitionTable(1 << 26, clock)
    keeper = LeaseKeeper(table, object(), object(), commit_interval=1, commit_max_acks=10)  # type: ignore[arg-type]
    seen: list[assigner_pb2.SessionAccepted] = []
    client = SessionClient(
        SessionIdentity("s1", "g", "127.0.0.1:1"),
        "127.0.0.1:2",
        keeper,
        safety_margin=0.5,
        events=dataclasses.replace(events or SessionEvents(), on_accepted=seen.append),
    )
    return client, seen
