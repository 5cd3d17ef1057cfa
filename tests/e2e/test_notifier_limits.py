"""Hostile fault reports on real Kafka: a 2 MB report is refused at ReportFault, and an
outbox item Kafka's producer refuses outright (here, over its message size) goes to the
dead-letter table instead of blocking every item behind it."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Consumer, Producer

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from dsclient.reasons import error_info
from services.devstack.kafka import KafkaHandle, TopicFactory
from services.notifier.outbox import KAFKA_LANE, Outbox, OutboxItem
from services.notifier.relay import ID_HEADER, KafkaRelay, RelayHooks
from tests.support.mesh import Mesh
from tests.support.notifier import (
    FAULTS_TOPIC,
    TopicReader,
    events,
    fault,
    header,
    metric_value,
    notifier_stub,
    start_notifier,
)
from tests.support.ops import metrics
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(180)


def item(topic: str, name: str, size: int = 10) -> OutboxItem:
    return OutboxItem(
        id=name,
        destination=topic,
        value=b"v" * size,
        key=b"g",
        headers=((ID_HEADER, name),),
    )


@pytest.mark.integration
def test_a_produce_error_on_one_item_does_not_block_the_next(
    kafka_cluster: KafkaHandle, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """The second of four items is over the producer's message.max.bytes: produce()
    raises at once. It is moved to the dead-letter table, reported to the hook, and the
    items before and after it are published in order."""
    topic = topic_factory(1)
    box = Outbox(tmp_path / "outbox.sqlite")
    box.append(
        [
            item(topic, "item-0"),
            item(topic, "item-1-oversized", size=2 * 1024 * 1024),
            item(topic, "item-2"),
            item(topic, "item-3"),
        ]
    )
    delivered: list[str] = []
    dead: list[tuple[str, str]] = []

    def on_delivered(done: Sequence[OutboxItem]) -> list[OutboxItem]:
        delivered.extend(i.id for i in done)
        return []

    ready = threading.Event()
    ready.set()
    relay = KafkaRelay(
        box,
        new_producer=lambda: Producer(
            {"bootstrap.servers": kafka_cluster.bootstrap, "enable.idempotence": True}
        ),
        new_consumer=lambda: Consumer(
            {"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "ds-test-dead-letter"}
        ),
        hooks=RelayHooks(
            delivered=on_delivered,
            dead_letter=lambda items, why: dead.extend((i.id, why) for i in items),
            reconciled=lambda _n: None,
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
        reader.wait(lambda m: len(m) >= 3, 30, "3 records")
        reader.poll(1.0)
        published = [header(m, ID_HEADER) for m in reader.messages]
    finally:
        reader.close()
    assert published == ["item-0", "item-2", "item-3"]
    assert sorted(delivered) == ["item-0", "item-2", "item-3"]
    assert [i for i, _why in dead] == ["item-1-oversized"]
    assert "MSG_SIZE_TOO_LARGE" in dead[0][1] or "too large" in dead[0][1].lower()
    (letter,) = box.dead_letters(10)
    assert letter.item.id == "item-1-oversized"
    assert len(letter.item.value) == 2 * 1024 * 1024
    assert letter.error == dead[0][1]
    box.close()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_2mb_fault_report_is_refused_and_later_reports_are_published(
    mesh: Mesh, kafka_cluster: KafkaHandle, tmp_path: Path
) -> None:
    notifier = start_notifier(mesh, tmp_path / "outbox.sqlite")
    notifier.wait_serving()
    reader = TopicReader(kafka_cluster.bootstrap, FAULTS_TOPIC, from_end=True)
    group = f"limits-{time.monotonic_ns()}"
    huge = fault(common_pb2.FAULT_TYPE_COMMIT_FAILED, group, message="huge")
    huge.attributes["blob"] = "x" * (2 * 1024 * 1024)
    too_many = fault(common_pb2.FAULT_TYPE_COMMIT_FAILED, group, message="partitions")
    too_many.partitions.extend(range(100_000))
    try:
        with notifier_stub(notifier.grpc_addr) as stub:
            for event, field in (
                (huge, "event.attributes[blob]"),
                (too_many, "event.partitions"),
            ):
                with pytest.raises(grpc.RpcError) as caught:
                    stub.ReportFault(notifier_pb2.ReportFaultRequest(event=event), timeout=10)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                info = error_info(caught.value)
                assert info is not None and info.reason == "INVALID_FIELD"
                assert info.metadata["field"] == field, caught.value.details()
            ok = fault(common_pb2.FAULT_TYPE_COMMIT_FAILED, group, message="after")
            answer = stub.ReportFault(notifier_pb2.ReportFaultRequest(event=ok), timeout=10)
        reader.wait(
            lambda m: any(e.id == answer.event_id for e in events(m)), 60, "the next report"
        )
        assert [e.message for e in events(reader.messages) if e.group == group] == ["after"]
        assert metric_value(metrics(notifier), "ds_notifier_outbox_dead_letters_total") is None
    finally:
        reader.close()
