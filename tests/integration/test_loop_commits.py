"""Commits the event loop makes itself (issue 34, offset_commits.py, commit_completions.py),
on the real broker.

A leased sidecar's commit is handed to librdkafka from the event loop without waiting, and
its answer is taken by the loop's own polls of the commit consumer; only a commit that must
first read the committed offsets back goes to the commit thread. What must hold either way:
a commit is durable in Kafka, with the lease's metadata, when ``commit_async`` returns (an
ack is answered accepted only then), and commits land in the order they were made.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.commit_completions import CommitCompletions
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.offset_commits import CommitRequest, OffsetCommitter
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.devstack.kafka import TopicFactory
from services.runtime import commitmeta
from services.runtime.kafka import new_consumer
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EPOCH = 7


class Answers(CommitCompletions):
    """The committer's answers, counted: how many commits were answered through them (the
    loop's way) rather than returned by a synchronous commit (the thread's)."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition] | None) -> None:
        before = self.waiting
        super().on_commit(error, partitions)
        self.taken += before - self.waiting


class Sidecar:
    """One sidecar's commit consumer and committer for ``group``, holding ``tps``."""

    def __init__(self, settings: ServiceSettings, group: str, tps: list[TP]) -> None:
        self.table = PartitionTable(1 << 20, time.monotonic)
        self.answers = Answers()
        self.fetch = new_consumer(settings, group=group, client_id="loop-fetch")
        self.commit_consumer = new_consumer(
            settings,
            group=group,
            client_id="loop-commit",
            overrides={"on_commit": self.answers.on_commit},
        )
        self.commits = OffsetCommitter(
            self.table,
            sidecar_id="loop",
            consumer=self.commit_consumer,
            completions=self.answers,
            external_check_seconds=60.0,
        )
        Fetcher(self.fetch, self.table, self.commits, batch=100, on_data=lambda: None)
        for tp in tps:
            self.table.add(
                Partition(tp=tp, epoch=EPOCH, deadline=time.monotonic() + 60, acks=PartitionAcks(0))
            )

    def close(self) -> None:
        self.commits.stop()  # the commit thread, then the commit consumer
        self.fetch.close()


@pytest.fixture
def held(topic_factory: TopicFactory) -> Iterator[tuple[list[TP], Sidecar, Consumer]]:
    topic = topic_factory(partitions=2)
    group = f"loop-commits-{uuid.uuid4().hex[:8]}"
    settings = ServiceSettings(bootstrap=topic_factory.bootstrap)
    tps = [TP(topic, 0), TP(topic, 1)]
    sidecar = Sidecar(settings, group, tps)
    reader = new_consumer(settings, group=group, client_id="reader")
    try:
        yield tps, sidecar, reader
    finally:
        sidecar.close()
        reader.close()


def committed(reader: Consumer, tps: list[TP]) -> dict[TP, tuple[int, str | None]]:
    found = reader.committed([TopicPartition(tp.topic, tp.partition) for tp in tps], timeout=10)
    return {
        TP(str(f.topic), int(f.partition or 0)): (int(f.offset or -1), f.metadata) for f in found
    }


def test_each_commit_from_the_loop_is_in_kafka_when_it_returns(
    held: tuple[list[TP], Sidecar, Consumer],
) -> None:
    tps, sidecar, reader = held

    async def scenario() -> None:
        await sidecar.commits.check_external_async(tps)  # read back: none due for 60 s
        for offset in range(1, 41):
            tp = tps[offset % 2]
            sent = await sidecar.commits.commit_async(
                [CommitRequest(tp, offset, EPOCH, ((offset + 2, offset + 3),))]
            )
            assert [r.offset for r in sent] == [offset]
            found, metadata = committed(reader, [tp])[tp]
            assert found == offset, f"commit of {offset} returned, Kafka has {found}"
            meta = commitmeta.decode(metadata, found)
            assert meta is not None
            assert (meta.epoch, meta.sidecar, meta.acked) == (
                EPOCH,
                "loop",
                ((offset + 2, offset + 3),),
            )

    asyncio.run(scenario())
    assert sidecar.answers.taken == 40, "every commit answered through the loop's polls"
    print(
        f"40 commits from the loop, each in Kafka when it returned; "
        f"{sidecar.answers.taken} answered by a poll"
    )


def test_a_commit_that_reads_back_first_goes_to_the_thread_and_lands_in_order(
    held: tuple[list[TP], Sidecar, Consumer],
) -> None:
    """Every other commit is due to read back (the thread's way, synchronous), the others
    go from the loop: the offsets land in the order they were made."""
    tps, sidecar, reader = held
    tp = tps[0]

    async def scenario() -> None:
        for offset in range(1, 21):
            sidecar.commits.external_check_seconds = 0.0 if offset % 2 else 60.0
            sent = await sidecar.commits.commit_async([CommitRequest(tp, offset, EPOCH)])
            assert [r.offset for r in sent] == [offset]
            assert committed(reader, [tp])[tp][0] == offset

    asyncio.run(scenario())
    assert sidecar.answers.taken == 10, "the commits with nothing to read back: the loop's"
    print(f"20 commits in order, {sidecar.answers.taken} from the loop, 10 on the thread")
