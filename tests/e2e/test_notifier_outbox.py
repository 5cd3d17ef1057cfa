"""The durable outbox on real Kafka: a 60 s outage with a kill -9 of the notifier in the
middle loses no fault and publishes none twice; a relay that died after Kafka stored some
items does not publish them again."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.devstack.kafka import KafkaCluster, KafkaHandle, KafkaOptions, TopicFactory
from services.devstack.ports import free_port
from services.notifier.outbox import KAFKA_LANE, Outbox, OutboxItem
from services.notifier.relay import ID_HEADER, KafkaRelay, RelayHooks
from tests.support.mesh import Mesh
from tests.support.notifier import (
    FAULTS_TOPIC,
    TopicReader,
    events,
    fault,
    header,
    notifier_config,
    notifier_stub,
    start_notifier,
    wait_listening,
)
from tests.support.waiting import wait_for

OUTAGE_SECONDS = 60.0


def report_all(address: str, group: str, ids: list[str]) -> None:
    """Report one COMMIT_FAILED per id; every call must be acknowledged."""
    with notifier_stub(address) as stub:
        for event_id in ids:
            event = fault(
                common_pb2.FAULT_TYPE_COMMIT_FAILED,
                group,
                id=event_id,
                consumer_id=f"sidecar-{event_id[:8]}",  # distinct: no storm suppression
                message="commit failed",
            )
            response = stub.ReportFault(notifier_pb2.ReportFaultRequest(event=event), timeout=10)
            assert response.event_id == event_id and not response.suppressed


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(420)
def test_kafka_down_60s_and_notifier_killed_loses_nothing(tmp_path: Path) -> None:
    began = time.monotonic()

    def phase(what: str) -> None:
        print(f"[{time.monotonic() - began:6.1f} s] {what}")

    cluster = KafkaCluster(KafkaOptions(base_dir=tmp_path / "kafka", port=free_port()))
    cluster.start()
    phase("Kafka started")
    mesh = Mesh(cluster.bootstrap, tmp_path)
    outbox = tmp_path / "outbox.sqlite"
    config = notifier_config(
        tmp_path / "notifier.yaml", lag={"enabled": False}, dependency_retry_max_seconds=1.0
    )
    group = f"outage-{uuid.uuid4().hex[:8]}"
    batches = [[str(uuid.uuid4()) for _ in range(n)] for n in (10, 20, 20, 10)]
    try:
        first = start_notifier(mesh, outbox, config, name="notifier-1")
        first.wait_serving(90)
        report_all(first.grpc_addr, group, batches[0])
        phase("notifier-1 serving; 10 faults reported")

        cluster.stop_broker(0)
        down_at = time.monotonic()
        report_all(first.grpc_addr, group, batches[1])  # accepted into the outbox
        first.kill()  # kill -9 in the middle of the outage
        phase("Kafka stopped; 20 faults reported; notifier-1 killed (SIGKILL)")

        second = start_notifier(mesh, outbox, config, name="notifier-2")
        wait_listening(second)
        report_all(second.grpc_addr, group, batches[2])
        phase("notifier-2 (same outbox) took 20 faults while Kafka is down")
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
        phase(f"Kafka down for {time.monotonic() - down_at:.1f} s: starting it again")

        cluster.start_broker(0)
        report_all(second.grpc_addr, group, batches[3])
        phase("Kafka back; 10 faults reported")
        sent = [event_id for batch in batches for event_id in batch]

        reader = TopicReader(cluster.bootstrap, FAULTS_TOPIC)
        try:

            def mine(messages: list[object]) -> list[str] | None:
                ids = [e.id for e in events(reader.messages) if e.group == group]
                return ids if len(ids) >= len(sent) else None

            reader.wait(mine, 150, f"{len(sent)} fault events of {group}")
            time.sleep(1)  # anything published twice would arrive right behind
            reader.poll(1.0)
            published = [e.id for e in events(reader.messages) if e.group == group]
        finally:
            reader.close()
        phase("all read back from ds.faults")
        print(f"reported {len(sent)}, published {len(published)}, distinct {len(set(published))}")
        assert len(published) == len(set(published)), "a fault event was published twice"
        assert published == sent, "every reported fault, in order"
        assert "Traceback" not in second.tail(400)
    finally:
        mesh.stop_all()
        cluster.stop()


@pytest.mark.integration
def test_relay_does_not_publish_again_what_kafka_already_has(
    kafka_cluster: KafkaHandle, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """The notifier died after Kafka stored 6 of 10 items but before the outbox forgot
    them: the next relay reads them back and publishes only the other 4."""
    topic = topic_factory(1)
    box = Outbox(tmp_path / "outbox.sqlite")
    items = [
        OutboxItem(
            id=f"item-{i}",
            destination=topic,
            value=f"v{i}".encode(),
            key=b"g",
            headers=((ID_HEADER, f"item-{i}"),),
        )
        for i in range(10)
    ]
    box.append(items)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap})
    for item in items[:6]:
        producer.produce(topic, key=item.key, value=item.value, headers=item.header_pairs())
    assert producer.flush(10) == 0

    delivered: list[str] = []
    reconciled: list[int] = []

    def on_delivered(done: Sequence[OutboxItem]) -> list[OutboxItem]:
        delivered.extend(i.id for i in done)
        return []

    ready = threading.Event()
    ready.set()
    relay = KafkaRelay(
        box,
        new_producer=lambda: Producer(
            {
                "bootstrap.servers": kafka_cluster.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
            }
        ),
        new_consumer=lambda: Consumer(
            {"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "ds-test-reconcile"}
        ),
        hooks=RelayHooks(
            delivered=on_delivered,
            dead_letter=lambda items, why: pytest.fail(f"dead letter {items[0].id}: {why}"),
            reconciled=reconciled.append,
        ),
        ready=ready,
    )
    relay.start()
    try:
        wait_for(lambda: box.count(KAFKA_LANE) == 0, 60, "the outbox to empty")
    finally:
        relay.stop(5)
    reader = TopicReader(kafka_cluster.bootstrap, topic)
    try:
        reader.wait(lambda m: len(m) >= 10, 30, "10 records")
        reader.poll(1.0)
        ids = [header(m, ID_HEADER) for m in reader.messages]
    finally:
        reader.close()
    assert ids == [f"item-{i}" for i in range(10)]
    assert reconciled[0] == 6
    assert sorted(delivered) == sorted(f"item-{i}" for i in range(10))
