"""The walking skeleton's Kafka helpers, shared by the e2e tests: produce numbered records,
read a group's committed offsets and the end offsets."""

from __future__ import annotations

from collections import defaultdict

from confluent_kafka import Producer

from tests.support import offsets

PARTITIONS = 12


def produce(bootstrap: str, topic: str, count: int) -> dict[int, list[int]]:
    """Produce ``count`` records keyed by sequence; returns the sequences per partition."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    expected: dict[int, list[int]] = defaultdict(list)
    for seq in range(count):
        partition = seq % PARTITIONS
        producer.produce(
            topic, key=str(seq).encode(), value=f"value-{seq}".encode(), partition=partition
        )
        expected[partition].append(seq)
        if seq % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0, "not every record was delivered to Kafka"
    return expected


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    return offsets.end_offsets(bootstrap, topic, PARTITIONS)


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    return offsets.committed_offsets(bootstrap, group, topic, PARTITIONS)
