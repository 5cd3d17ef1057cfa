"""Read a topic's end offsets and a group's committed offsets straight from Kafka.

Committed offsets are read by a consumer of the group that never subscribes (so it never
joins the group) and never commits — not by ``AdminClient.list_consumer_group_offsets``:
librdkafka 2.16 dereferences a NULL consumer group when an AdminClient's OffsetFetch is
answered NOT_COORDINATOR (confluentinc/librdkafka#5040, see services/assigner/admin.py),
which would kill the test process itself.
"""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ds-test-watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def group_reader(bootstrap: str, group: str) -> Consumer:
    """A consumer to read ``group``'s committed offsets with (close it when done)."""
    return Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )


def committed_partitions(
    bootstrap: str, group: str, topic: str, partitions: int, *, reader: Consumer | None = None
) -> list[TopicPartition]:
    """The group's committed offset (-1001 = none) and metadata of each partition."""
    consumer = reader or group_reader(bootstrap, group)
    try:
        return list(
            consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        )
    finally:
        if reader is None:
            consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    return {
        tp.partition: tp.offset for tp in committed_partitions(bootstrap, group, topic, partitions)
    }
