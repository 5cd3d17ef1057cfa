"""A lease that expired locally and is granted back to the same sidecar under a new epoch.

Seen in the probe's e2e test: the sidecar was SIGSTOPped past its lease TTL, suspended the
lease on waking (paused and rewound in librdkafka, still assigned), and the assigner granted
the partition back to it at epoch 2. ``incremental_assign`` refused the partition as already
assigned (``_CONFLICT``), so it never delivered again. Here on a real broker and a real
librdkafka consumer, with the lease clock driven by the test (each grant goes live with the
renewal its first heartbeat ack brings, as in the session).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer

from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.offset_commits import OffsetCommitter
from services.consumer_sidecar.partitions import PartitionTable
from services.devstack.kafka import KafkaHandle, TopicFactory
from services.runtime.topic_partition import TP
from tests.support.producing import produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDS = 30


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


async def take(table: PartitionTable, want: int, timeout: float = 30.0) -> list[tuple[int, int]]:
    """(offset, epoch) of the next ``want`` records delivered."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        for piece in table.take(want - len(got), 1 << 20):
            got.extend((offset, piece.epoch) for offset in piece.offsets)
        await asyncio.sleep(0.05)
    return got


def test_a_suspended_lease_granted_back_under_a_new_epoch_delivers_again(
    kafka_cluster: KafkaHandle, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=1)
    produce(
        kafka_cluster.bootstrap,
        topic,
        range(RECORDS),
        partition_of=lambda _seq: 0,
        value=lambda i: b"v%d" % i,
        keyed=False,
        idempotent=False,
    )
    clock = Clock()
    table = PartitionTable(1 << 26, clock)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "group.id": f"regrant-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    commits = OffsetCommitter(table, sidecar_id="s")
    fetcher = Fetcher(consumer, table, commits, batch=100, on_data=lambda: None)
    keeper = LeaseKeeper(
        table, fetcher, commits, commit_interval=1.0, commit_max_acks=100, clock=clock
    )
    tp = TP(topic, 0)

    async def scenario() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        fetcher.start()
        try:
            assert keeper.grant(tp, 1, clock.now)
            keeper.renew(tp, 1, clock.now + 10)  # the first heartbeat ack after the grant
            await keeper.start_fetching({tp: -1})
            first = await take(table, 10)
            clock.now += 20  # paused past the deadline: the lease is suspended on waking
            await keeper.suspend_expired()
            part = table.get(tp)
            assert part is not None and part.suspended_at is not None
            assert table.take(100, 1 << 20) == []  # a suspended lease delivers nothing
            # The assigner gave the partition back to this sidecar under epoch 2.
            assert keeper.grant(tp, 2, clock.now)
            keeper.renew(tp, 2, clock.now + 10)
            await keeper.start_fetching({tp: -1})
            again = await take(table, RECORDS)
            return first, again
        finally:
            commits.stop()
            fetcher.stop()
            consumer.close()

    first, again = asyncio.run(scenario())
    assert first == [(o, 1) for o in range(10)]
    # Nothing was committed under epoch 1, so epoch 2 starts over at the beginning.
    assert again == [(o, 2) for o in range(RECORDS)]
