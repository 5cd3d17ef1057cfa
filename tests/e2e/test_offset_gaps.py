"""A sidecar whose position falls outside the partition's log (the group's committed offset
below the log start: records deleted by retention before they were read) jumps to the log
start, as librdkafka's offset reset would, but says so: the skipped records are counted in
``ds_sidecar_offset_gaps_total`` and reported as an ``OFFSET_GAP`` fault naming the
partition and the offsets, instead of vanishing silently.

Real Kafka, a real assigner, sidecar and notifier.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from dsclient import DsClient
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh
from tests.support.notifier import (
    metric_value,
    notifier_stub,
    start_notifier,
)
from tests.support.ops import metrics
from tests.support.producing import produce
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RECORDS, COMMITTED, LOG_START = 100, 10, 50


def test_a_committed_offset_below_the_log_start_is_a_counted_gap_and_a_fault(
    mesh: Mesh, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)  # type: ignore[operator]
    group = f"g-{topic}"
    produce(mesh.bootstrap, topic, range(RECORDS))
    # The group last committed 10; retention then deleted everything below 50.
    committer = Consumer({"bootstrap.servers": mesh.bootstrap, "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, 0, COMMITTED)], asynchronous=False)
    committer.close()
    admin = AdminClient({"bootstrap.servers": mesh.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, LOG_START)]).values():
        future.result(30)

    notifier = start_notifier(mesh, tmp_path / "outbox.sqlite")
    assigner = mesh.assigner([(group, [topic])], "--notifier", notifier.grpc_addr)
    sidecar = mesh.sidecar(group, assigner, "sc-1", "--notifier", notifier.grpc_addr)
    for svc in (notifier, assigner, sidecar):
        svc.wait_serving(90)
    wait_stable(assigner.grpc_addr, group, ["sc-1"], 1)

    offsets: list[int] = []
    with DsClient(group, client_id="gap-reader", assigner=assigner.grpc_addr) as client:
        deadline = time.monotonic() + 30
        while len(offsets) < RECORDS - LOG_START and time.monotonic() < deadline:
            batch = client.fetch(max_records=100, max_wait=1.0)
            if batch:
                client.ack(batch)
                offsets += [r.offset for r in batch]
    assert offsets == list(range(LOG_START, RECORDS)), offsets[:5]

    gaps = wait_for(
        lambda: metric_value(
            metrics(sidecar), "ds_sidecar_offset_gaps_total", topic=topic, partition="0"
        ),
        10,
        "ds_sidecar_offset_gaps_total",
    )
    assert gaps == LOG_START - COMMITTED
    gap_type = common_pb2.FaultType.Value("FAULT_TYPE_OFFSET_GAP")

    def reported() -> list[common_pb2.FaultEvent]:
        with notifier_stub(notifier.grpc_addr) as stub:
            listed = stub.ListFaults(notifier_pb2.ListFaultsRequest(group=group), timeout=5)
        return [e for e in listed.faults if e.type == gap_type]

    (event, *_) = wait_for(reported, 30, "an OFFSET_GAP fault")
    print(f"gap counted {gaps:.0f}; fault: {event.message} {dict(event.attributes)}")
    assert (event.topic, list(event.partitions)) == (topic, [0])
    assert dict(event.attributes)["from_offset"] == str(COMMITTED)
    assert dict(event.attributes)["to_offset"] == str(LOG_START)
