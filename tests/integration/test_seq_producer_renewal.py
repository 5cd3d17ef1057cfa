"""The failure tests' producer (tests/support/records.py ``SeqProducer``) replaces a producer
that stopped sending: what it had queued is produced again by a fresh one, once each.

Stuck here means a producer that cannot reach any broker (its bootstrap is a closed port)
while the next one can: the records queued in the first were never sent, so moving them
writes none twice, and every sequence ends in Kafka exactly once.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from services.devstack.kafka import KafkaHandle
from services.devstack.ports import free_ports
from tests.support.offsets import end_offsets
from tests.support.records import SeqProducer
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RECORDS = 60


class FirstOneStuck(SeqProducer):
    """Its first producer reaches no broker (a free port: nothing listens there); the ones
    made after it reach Kafka."""

    made = 0

    def _new_producer(self) -> Producer:
        self.made += 1
        if self.made == 1:
            (port,) = free_ports(1)
            return Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
        return super()._new_producer()


def test_a_stuck_producers_queue_is_produced_again_by_a_fresh_one_once_each(
    kafka_cluster: KafkaHandle, topic_factory: object
) -> None:
    topic = topic_factory(partitions=3)  # type: ignore[operator]
    producer = FirstOneStuck(
        kafka_cluster.bootstrap, topic, 3, rate=200, limit=RECORDS, stall_seconds=2
    ).start()
    wait_for(
        lambda: len(producer.confirmed()) == RECORDS, 90, "every record confirmed",
        detail=lambda: f"confirmed {sorted(producer.confirmed())}",
    )  # fmt: skip
    confirmed = producer.stop()

    assert producer.renewals >= 1
    assert confirmed == set(range(RECORDS))
    assert len(set(producer.placed.values())) == RECORDS, "a sequence written twice"
    assert sum(end_offsets(kafka_cluster.bootstrap, topic, 3).values()) == RECORDS
