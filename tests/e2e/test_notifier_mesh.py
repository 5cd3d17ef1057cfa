"""Faults from the mesh itself: kill -9 a sidecar → CONSUMER_LOST for its group on
``ds.faults`` within lease TTL + grace + 2 s, then PARTITIONS_REASSIGNED; bring it back →
CONSUMER_LOST resolved."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from dataservice.common.v1 import common_pb2
from services.devstack.kafka import KafkaHandle, TopicFactory
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.notifier import (
    FAULTS_TOPIC,
    TopicReader,
    events,
    metric_value,
    start_notifier,
)
from tests.support.ops import metrics
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

TTL, GRACE = 3.0, 1.0  # the assigner's defaults


def held(assigner: ServiceProcess, group: str, sidecar: str) -> float:
    value = metric_value(metrics(assigner), "ds_assigner_partitions", group=group, sidecar=sidecar)
    return value or 0.0


def test_sidecar_kill_is_consumer_lost_then_reassigned_then_resolved(
    kafka_cluster: KafkaHandle, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = topic_factory(4)
    group = f"mesh-{uuid.uuid4().hex[:8]}"
    with running_mesh(kafka_cluster.bootstrap, tmp_path) as mesh:
        # All start at once: faults reported before the notifier serves are buffered.
        notifier = start_notifier(mesh, tmp_path / "outbox.sqlite")
        to_notifier = ("--notifier", notifier.grpc_addr)
        assigner = mesh.assigner([(group, [topic])], *to_notifier)
        first = mesh.sidecar(group, assigner, "sidecar-a", *to_notifier)
        second = mesh.sidecar(group, assigner, "sidecar-b", *to_notifier)
        for svc in (notifier, assigner, first, second):
            svc.wait_serving(90)
        wait_for(
            lambda: (
                held(assigner, group, "sidecar-a") == 2 and held(assigner, group, "sidecar-b") == 2
            ),
            60,
            "two partitions on each sidecar",
        )
        # What start-up caused (the first sidecar gets everything, then hands two
        # partitions to the second) has reached the notifier and Kafka before the kill.
        wait_for(
            lambda: metric_value(metrics(assigner), "ds_fault_reports_buffered") == 0,
            30,
            "the assigner's reporter to be drained",
        )
        time.sleep(1)
        faults = TopicReader(kafka_cluster.bootstrap, FAULTS_TOPIC, from_end=True)
        try:
            killed_at = time.time()
            first.kill()

            def of(fault_type: int, state: int) -> list[common_pb2.FaultEvent]:
                return [
                    e
                    for e in events(faults.messages)
                    if e.group == group and e.type == fault_type and e.state == state
                ]

            OPEN, RESOLVED = common_pb2.FAULT_STATE_OPEN, common_pb2.FAULT_STATE_RESOLVED
            lost = faults.wait(
                lambda _m: of(common_pb2.FAULT_TYPE_CONSUMER_LOST, OPEN), 30, "CONSUMER_LOST"
            )[0]
            arrived = time.time()
            detected = lost.detected_at.ToNanoseconds() / 1e9
            print(
                f"CONSUMER_LOST detected {detected - killed_at:.2f} s after the kill, "
                f"on ds.faults after {arrived - killed_at:.2f} s (TTL + grace = {TTL + GRACE} s)"
            )
            assert lost.consumer_id == "sidecar-a" and lost.source_service == "assigner"
            assert detected - killed_at <= TTL + GRACE + 2

            def after_lost(_m: list[object]) -> list[common_pb2.FaultEvent]:
                published = events(faults.messages)
                since = [e.id for e in published].index(lost.id)
                return [
                    e
                    for e in published[since:]
                    if e.group == group
                    and e.type == common_pb2.FAULT_TYPE_PARTITIONS_REASSIGNED
                    and e.state == OPEN
                ]

            moved = faults.wait(after_lost, 30, "PARTITIONS_REASSIGNED after CONSUMER_LOST")[0]
            assert moved.topic == topic and len(moved.partitions) == 2
            assert moved.attributes["from"] == "sidecar-a"
            assert moved.attributes["to"] == "sidecar-b"

            mesh.sidecar(group, assigner, "sidecar-a", *to_notifier).wait_serving(90)
            resolved = faults.wait(
                lambda _m: of(common_pb2.FAULT_TYPE_CONSUMER_LOST, RESOLVED),
                30,
                "CONSUMER_LOST resolved",
            )[0]
            assert resolved.consumer_id == "sidecar-a"
            assert resolved.dedupe_key == lost.dedupe_key
        finally:
            faults.close()
