"""What the assigner asks Kafka about topics and consumer groups, through the process's one
AdminClient: a group's partitions, a classic group's members, and which broker leads
each partition (for ``/ui``).

The answers are read from the cluster metadata by pure functions (:func:`partitions_of`,
:func:`broker_leaders_of`); :class:`KafkaCluster` only fetches it, in worker threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# Where it is defined: confluent_kafka.admin imports it without re-exporting it (mypy).
from confluent_kafka.admin._metadata import ClusterMetadata

from dsclient.reasons import DsError, Reason
from services.runtime.topic_partition import TopicPartition

METADATA_TIMEOUT_SECONDS = 5.0
DESCRIBE_TIMEOUT_SECONDS = 10.0

BrokerLeaders = tuple[dict[TopicPartition, int], dict[int, str]]


def partitions_of(metadata: ClusterMetadata, topics: Sequence[str]) -> list[TopicPartition]:
    """Every partition of ``topics``, topic by topic, in partition order;
    TOPIC_NOT_FOUND for a topic Kafka does not know (or reports with an error)."""
    result: list[TopicPartition] = []
    for topic in topics:
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            raise DsError(
                Reason.TOPIC_NOT_FOUND,
                f"topic {topic!r} does not exist",
                metadata={"topic": topic},
            )
        result.extend(TopicPartition(topic, p) for p in sorted(info.partitions))
    return result


def broker_leaders_of(metadata: ClusterMetadata, topics: Sequence[str]) -> BrokerLeaders:
    """Partition -> leader broker id, and broker id -> host:port; unknown topics are left
    out (the page shows what Kafka knows)."""
    hosts = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    leaders: dict[TopicPartition, int] = {}
    for topic in topics:
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            continue
        for p in info.partitions.values():
            leaders[TopicPartition(topic, p.id)] = p.leader
    return leaders, hosts


class GroupMembers(Protocol):
    """Kafka's classic consumer groups, as the admin operations ask about them (a mode
    switch, a reset, the old "stop everything first" rule): :class:`KafkaCluster`."""

    async def group_members(self, group: str) -> int:
        """Members of the Kafka consumer group; DsError KAFKA_UNAVAILABLE."""
        ...


class KafkaCluster:
    """Kafka's metadata and group descriptions, read through one shared AdminClient."""

    def __init__(self, admin: AdminClient) -> None:
        self._admin = admin

    async def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        """The partitions of ``topics`` (:func:`partitions_of`); KAFKA_UNAVAILABLE when the
        metadata cannot be read."""
        try:
            metadata = await asyncio.to_thread(
                self._admin.list_topics, timeout=METADATA_TIMEOUT_SECONDS
            )
        except KafkaException as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, f"cannot read Kafka metadata: {exc}") from exc
        return partitions_of(metadata, topics)

    async def group_members(self, group: str) -> int:
        """Members of the Kafka consumer group ``group`` (classic subscribe() consumers)."""

        def describe() -> int:
            futures = self._admin.describe_consumer_groups(
                [group], request_timeout=DESCRIBE_TIMEOUT_SECONDS
            )
            return len(futures[group].result(timeout=DESCRIBE_TIMEOUT_SECONDS).members)

        try:
            return await asyncio.to_thread(describe)
        except KafkaException as exc:
            raise DsError(
                Reason.KAFKA_UNAVAILABLE, f"cannot describe group {group!r}: {exc}"
            ) from exc

    def broker_leaders(self, topics: Sequence[str]) -> BrokerLeaders:
        """:func:`broker_leaders_of` the current metadata. Blocks: call it in a thread;
        raises KafkaException when the metadata cannot be read."""
        return broker_leaders_of(self._admin.list_topics(timeout=METADATA_TIMEOUT_SECONDS), topics)
