"""The compacted-topic primitive (services/runtime/topics.py) on a real broker, and the two
stores built on it writing the same bytes they always wrote (so existing topics load)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from dataservice.notifier.v1 import notifier_pb2
from services.assigner.state import GroupRecord, StateStore
from services.devstack.kafka import TopicFactory
from services.notifier.template_store import TemplateStore
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP
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


def test_state_store_writes_the_bytes_it_always_wrote_and_loads_them(
    topic_factory: TopicFactory,
) -> None:
    name = topic_factory.reserve()
    store = StateStore(settings_for(topic_factory), topic=name)
    group = GroupRecord(name="g", topics=["t1"], consumer_config={"fetch.min.bytes": "1"})
    try:
        store.ensure_topic()

        async def write() -> None:
            await store.put_group(group)
            await store.put_epochs("g", [(TP("t1", 0), 3), (TP("t1", 1), 5)])
            await store.put_binding("g", "c1")
            await store.put_binding("g", "c2")
            await store.delete_binding("g", "c1")

        asyncio.run(write())
        snapshot = store.load()
    finally:
        store.close()
    assert raw_records(topic_factory.bootstrap, name) == [
        (
            b'["group","g"]',
            b'{"name": "g", "topics": ["t1"], "mode": "leased", "consumer_config": '
            b'{"fetch.min.bytes": "1"}, "config_version": 1, "balance_strategy": "count"}',
        ),
        (b'["epoch","g","t1",0]', b'{"epoch": 3}'),
        (b'["epoch","g","t1",1]', b'{"epoch": 5}'),
        (b'["binding","g","c1"]', b'{"bound":true}'),
        (b'["binding","g","c2"]', b'{"bound":true}'),
        (b'["binding","g","c1"]', None),
    ]
    assert snapshot.groups == {"g": group}
    assert snapshot.epochs == {"g": {TP("t1", 0): 3, TP("t1", 1): 5}}
    assert snapshot.bindings == {"g": {"c2"}}
    assert snapshot.records == 6


def test_template_stores_write_the_same_bytes_and_follow_each_other(
    topic_factory: TopicFactory,
) -> None:
    name = topic_factory.reserve()
    settings = settings_for(topic_factory)
    admin = AdminClient({"bootstrap.servers": topic_factory.bootstrap})
    first = TemplateStore(settings, name, admin=admin, replication=1)
    second = TemplateStore(settings, name, admin=admin, replication=1)
    template = notifier_pb2.AlertTemplate(caller="team-a", name="lag", open_template="{{ group }}")
    try:
        first.start(timeout=30)
        second.start(timeout=30)

        async def put_then_delete() -> None:
            await first.put(template)
            deadline = time.monotonic() + 30
            while second.get("team-a", "lag") is None:  # the second replica's tail
                assert time.monotonic() < deadline, "the other store never saw the put"
                await asyncio.sleep(0.05)
            await second.delete("team-a", "lag")

        asyncio.run(put_then_delete())
        assert second.get("team-a", "lag") is None
    finally:
        first.stop()
        second.stop()
    key = json.dumps(["team-a", "lag"]).encode()
    assert key == b'["team-a", "lag"]'
    assert raw_records(topic_factory.bootstrap, name) == [
        (key, template.SerializeToString()),
        (key, None),
    ]

    restarted = TemplateStore(settings, name, admin=admin, replication=1)
    try:
        restarted.start(timeout=30)
        assert restarted.all() == []
    finally:
        restarted.stop()


def _voluntary_switches(tid: int | None) -> int:
    status = Path(f"/proc/self/task/{tid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("voluntary_ctxt_switches"))
    return int(line.split()[1])


def test_an_idle_topic_producer_thread_sleeps_and_a_write_is_not_held_up(
    topic_factory: TopicFactory,
) -> None:
    """Issue 34: the producer thread polled every 50 ms (20 wake-ups a second idle); it
    now sleeps until a delivery report, and a write still completes while it sleeps."""
    name = topic_factory.reserve()
    topic = CompactedTopic(settings_for(topic_factory), name, client_id="test-topics-idle")
    try:
        topic.ensure()

        async def write() -> list[int]:
            return await topic.produce([(b"k", b"v")], timeout=30)

        assert asyncio.run(write()) == [0]
        tid = topic._poller.native_id
        before = _voluntary_switches(tid)
        time.sleep(2.0)
        # 40 with a 50 ms poll; confluent-kafka (>= 2.13) waits in 200 ms slices to see a
        # Ctrl-C, so a sleeping poll() still wakes 5 times a second.
        assert _voluntary_switches(tid) - before <= 14
        assert asyncio.run(write()) == [1]  # a delivery report wakes the sleeping poll
    finally:
        topic.close()
