"""The compacted-topic primitive (services/runtime/topics.py) on a real broker."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from services.devstack.kafka import TopicFactory
from services.runtime.settings import ServiceSettings
from services.runtime.topics import CompactedTopic, Record, TopicSpec, ensure_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def settings_for(factory: TopicFactory) -> ServiceSettings:
    return ServiceSettings(bootstrap=factory.bootstrap)


def raw_records(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record in partition 0, read by a plain consumer."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-topics-raw",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    records: list[tuple[bytes | None, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return records
            assert error is None, error
            records.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    raise AssertionError(f"{topic}: end not reached in 30 s")


def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=10)
    return {name: entry.value for name, entry in entries.items()}


def test_ensure_creates_a_compacted_topic_once_and_then_leaves_it(
    topic_factory: TopicFactory,
) -> None:
    name = topic_factory.reserve()
    topic = CompactedTopic(
        settings_for(topic_factory),
        name,
        client_id="test-topics",
        config={"min.compaction.lag.ms": "0"},
    )
    try:
        assert topic.ensure() is True
        assert topic.ensure() is False  # already there: fine, nothing changed
    finally:
        topic.close()
    configs = topic_configs(topic_factory.bootstrap, name)
    assert configs["cleanup.policy"] == "compact"
    assert configs["min.compaction.lag.ms"] == "0"
    assert configs["min.insync.replicas"] == "1"  # one broker: 1 replica, 1 in sync


def test_ensure_leaves_an_existing_topic_as_it_is(topic_factory: TopicFactory) -> None:
    name = topic_factory(partitions=3)
    admin = AdminClient({"bootstrap.servers": topic_factory.bootstrap})
    spec = TopicSpec(name, 1, 1, {"cleanup.policy": "compact"})
    assert ensure_topic(admin, spec) is False
    assert len(admin.list_topics(timeout=10).topics[name].partitions) == 3
    assert topic_configs(topic_factory.bootstrap, name)["cleanup.policy"] == "delete"


def test_load_to_end_tail_and_produce_and_await(topic_factory: TopicFactory) -> None:
    name = topic_factory.reserve()
    settings = settings_for(topic_factory)
    writer = CompactedTopic(settings, name, client_id="test-topics-writer")
    reader = CompactedTopic(settings, name, client_id="test-topics-reader")
    written = [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"b", None)]
    try:
        writer.ensure()
        assert reader.load(lambda r: pytest.fail(f"empty topic gave {r}")) == 0

        async def write(records: list[tuple[bytes, bytes | None]]) -> list[int]:
            return await writer.produce(records, timeout=30)

        assert asyncio.run(write(written)) == [0, 1, 2, 3]

        loaded: list[Record] = []
        end = reader.load(loaded.append, timeout=30)
        assert end == 4
        assert loaded == [Record(k, v, i) for i, (k, v) in enumerate(written)]

        tailed: list[Record] = []
        seen = threading.Event()

        def on_tail(record: Record) -> None:
            tailed.append(record)
            seen.set()

        reader.tail(on_tail, start=end)
        (offset,) = asyncio.run(write([(b"c", b"4")]))
        assert offset == 4
        assert seen.wait(30), "the tail did not see the new record"
        assert tailed == [Record(b"c", b"4", 4)]  # nothing before the loaded end again
    finally:
        reader.close()
        writer.close()


def test_a_write_kafka_refuses_fails_with_its_error(topic_factory: TopicFactory) -> None:
    name = topic_factory.reserve()
    topic = CompactedTopic(
        settings_for(topic_factory),
        name,
        client_id="test-topics-refused",
        producer_overrides={"message.max.bytes": 10_000},
    )
    try:
        topic.ensure()

        async def refusal() -> int | None:
            try:
                await topic.produce([(b"k", b"x" * 20_000)], timeout=30)
            except KafkaException as exc:
                return int(exc.args[0].code())
            return None

        assert asyncio.run(refusal()) == KafkaError.MSG_SIZE_TOO_LARGE
    finally:
        topic.close()
