"""Commits fenced by Kafka (issue 36, ``commit_fencing: kafka``): a holder that outlived
its lease cannot commit behind the next holder, whatever the clocks.

Two fetchers of one leased group play two sidecars on the real broker: the old holder
(epoch 1) commits, the next holder (epoch 2) is granted the partition and initialises the
lease's transactional id before reading its start offset; the old holder wakes up (its
local deadline never stopped it: no deadline in this mode) and commits. Kafka refuses it
with ``_FENCED``; nothing of it reaches the group; the old holder's lease ends at once;
the next holder started from the old holder's last commit and commits on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from services.assigner.kafka_offsets import KafkaOffsets
from services.assigner.kafka_reset import KafkaResets
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.events import CommitEvents
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.kafka_fenced_commits import (
    COMMIT_PRODUCER_CONFIG,
    FencedCommitter,
    LeaseFenced,
)
from services.consumer_sidecar.offset_commits import CommitRequest, OffsetCommitter
from services.consumer_sidecar.partitions import NO_DEADLINE, Partition, PartitionTable
from services.devstack.kafka import TopicFactory
from services.runtime import commitmeta
from services.runtime.kafka import new_consumer, new_producer
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Holder:
    """One sidecar's fetch consumer, commit consumer and lease producers for ``group``."""

    def __init__(self, settings: ServiceSettings, group: str, name: str) -> None:
        self.table = PartitionTable(1 << 20, lambda: 0.0)
        self.fetch = new_consumer(settings, group=group, client_id=f"{name}-fetch")
        self.commit_consumer = new_consumer(settings, group=group, client_id=f"{name}-commit")
        self.fenced: list[LeaseFenced] = []
        self.commits = OffsetCommitter(
            self.table,
            sidecar_id=name,
            events=CommitEvents(on_fenced=self.fenced.append),
            consumer=self.commit_consumer,
            fenced=FencedCommitter(
                group,
                lambda txn_id: new_producer(
                    settings,
                    client_id=f"{name}-lease",
                    overrides={**COMMIT_PRODUCER_CONFIG, "transactional.id": txn_id},
                ),
                self.commit_consumer.consumer_group_metadata,
            ),
        )
        self.commits.external_changes = "ignore"
        self.fetcher = Fetcher(
            self.fetch, self.table, self.commits, batch=100, on_data=lambda: None
        )

    def grant(self, tp: TP, epoch: int) -> int:
        """A confirmed grant under commit_fencing: kafka (no deadline; the lease keeper sets
        Partition.kafka_fenced at the grant) started from the committed
        offset; the offset it starts from."""
        self.table.add(
            Partition(
                tp=tp, epoch=epoch, deadline=NO_DEADLINE, acks=PartitionAcks(-1), kafka_fenced=True
            )
        )
        return self.fetcher.assign({tp: -1})[tp]

    def close(self) -> None:
        # The fetch thread never ran (the test calls the fetch-thread methods itself).
        assert self.commits.fenced is not None
        self.commits.fenced.close_all()
        self.commit_consumer.close()
        self.fetch.close()


@pytest.fixture
def holders(topic_factory: TopicFactory) -> Iterator[tuple[TP, Holder, Holder, Consumer]]:
    topic = topic_factory(partitions=1)
    group = f"fenced-{uuid.uuid4().hex[:8]}"
    settings = ServiceSettings(bootstrap=topic_factory.bootstrap)
    old, new = Holder(settings, group, "old"), Holder(settings, group, "new")
    reader = new_consumer(settings, group=group, client_id="reader")
    try:
        yield TP(topic, 0), old, new, reader
    finally:
        old.close()
        new.close()
        reader.close()


def committed(reader: Consumer, tp: TP) -> tuple[int, str | None]:
    found = reader.committed([TopicPartition(tp.topic, tp.partition)], timeout=10)[0]
    return int(found.offset if found.offset is not None else -1), found.metadata


def test_a_zombie_holders_commit_is_refused_by_kafka_after_the_next_holder_took_over(
    holders: tuple[TP, Holder, Holder, Consumer],
) -> None:
    tp, old, new, reader = holders
    assert old.grant(tp, 1) == 0  # nothing committed yet: from the log start

    # The old holder commits: a transaction of its lease producer, visible to the group
    # with the lease's metadata (the group has no members: generation -1 is accepted).
    assert old.commits.commit([CommitRequest(tp, 10, 1)]) == [CommitRequest(tp, 10, 1)]
    offset, metadata = committed(reader, tp)
    assert offset == 10
    meta = commitmeta.decode(metadata, offset)
    assert meta is not None and meta.epoch == 1

    # The partition moves (the old holder paused past its lease): the next holder's grant
    # initialises the lease's transactional id first, then reads where to start.
    assert new.grant(tp, 2) == 10

    # The old holder wakes up and commits ahead of what it had: refused at the broker.
    assert old.commits.commit([CommitRequest(tp, 25, 1)]) == []
    assert [f.tp for f in old.fenced] == [tp]
    error = old.fenced[0].error
    assert error is not None and error.code() == KafkaError._FENCED
    assert old.table.get(tp) is not None and old.table.partitions[tp].revoking
    assert committed(reader, tp)[0] == 10  # nothing of the zombie's commit landed
    # Its lease producer is gone: a later commit is refused here, never re-initialised.
    assert old.commits.commit([CommitRequest(tp, 26, 1)]) == []

    # The next holder commits on from where it started.
    assert new.commits.commit([CommitRequest(tp, 12, 2)]) == [CommitRequest(tp, 12, 2)]
    assert committed(reader, tp)[0] == 12
    assert new.fenced == []


def test_commits_of_several_leases_are_one_transaction_each_and_all_land(
    topic_factory: TopicFactory,
) -> None:
    topic = topic_factory(partitions=4)
    group = f"fenced-{uuid.uuid4().hex[:8]}"
    settings = ServiceSettings(bootstrap=topic_factory.bootstrap)
    holder = Holder(settings, group, "one")
    reader = new_consumer(settings, group=group, client_id="reader")
    try:
        tps = [TP(topic, p) for p in range(4)]
        for tp in tps:
            holder.grant(tp, 3)
        requests = [CommitRequest(tp, 5 + tp.partition, 3) for tp in tps]
        assert holder.commits.commit(requests) == requests
        assert [committed(reader, tp)[0] for tp in tps] == [5, 6, 7, 8]
        assert holder.fenced == []
    finally:
        holder.close()
        reader.close()


def test_without_kafka_fencing_the_broker_takes_a_zombies_commit(
    topic_factory: TopicFactory,
) -> None:
    """Why ``commit_fencing: kafka`` exists (ARCHITECTURE §10): a plain OffsetCommit from a
    consumer that is not a group member is not fenced by the broker. In ``lease`` mode only
    the old holder's local deadline keeps it from committing behind the next holder."""
    topic = topic_factory(partitions=1)
    group = f"unfenced-{uuid.uuid4().hex[:8]}"
    settings = ServiceSettings(bootstrap=topic_factory.bootstrap)
    old = new_consumer(settings, group=group, client_id="old")
    new = new_consumer(settings, group=group, client_id="new")
    try:
        new.commit(offsets=[TopicPartition(topic, 0, 12)], asynchronous=False)  # next holder
        old.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)  # the zombie
        assert committed(new, TP(topic, 0))[0] == 7  # behind the next holder's commit
    finally:
        old.close()
        new.close()


def test_an_offset_reset_fences_the_holder_it_reset_behind(topic_factory: TopicFactory) -> None:
    """An assigner's reset of a leased partition while its holder is cut off from the
    assigner (so still serving and committing under commit_fencing: kafka): the reset's
    commit initialises the lease's transactional id first, so the holder's next commit is
    refused at the broker and the reset offset stands until the re-grant."""
    topic = topic_factory(partitions=1)
    group = f"fenced-{uuid.uuid4().hex[:8]}"
    settings = ServiceSettings(bootstrap=topic_factory.bootstrap)
    tp = TP(topic, 0)
    holder = Holder(settings, group, "cut-off")
    reader = new_consumer(settings, group=group, client_id="reader")
    try:
        assert holder.grant(tp, 1) == 0
        assert holder.commits.commit([CommitRequest(tp, 40, 1)]) == [CommitRequest(tp, 40, 1)]

        KafkaResets(settings, KafkaOffsets(settings)).commit(group, {tp: (5, 2)}, fence_leases=True)
        offset, metadata = committed(reader, tp)
        assert offset == 5
        meta = commitmeta.decode(metadata, offset)
        assert meta is not None and meta.epoch == 2 and meta.sidecar == commitmeta.ASSIGNER

        # The cut-off holder commits what it had acked since: Kafka refuses it.
        assert holder.commits.commit([CommitRequest(tp, 45, 1)]) == []
        assert [f.tp for f in holder.fenced] == [tp]
        error = holder.fenced[0].error
        assert error is not None and error.code() == KafkaError._FENCED
        assert committed(reader, tp)[0] == 5  # the reset stands
    finally:
        holder.close()
        reader.close()
