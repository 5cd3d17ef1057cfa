"""The shared reporter and storm suppression on a real broker: the reporter buffers until
the notifier is up, and a storm of 1,000 COMMIT_FAILED reports is suppressed to one event
per window with the count carried."""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from dataservice.common.v1 import common_pb2
from services.devstack.kafka import KafkaHandle
from services.devstack.ports import free_ports
from services.notifier.suppression import SUMMARY_ATTRIBUTE
from services.runtime.reporter import FaultReporter, ReporterConfig
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.notifier import (
    FAULTS_TOPIC,
    TopicReader,
    events,
    metric_value,
    notifier_config,
)
from tests.support.ops import metrics
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

WINDOW = 4.0


def notifier_process(mesh: Mesh, tmp_path: Path) -> ServiceProcess:
    """Not started yet: its ports are known first, so a reporter can point at it."""
    config = notifier_config(
        tmp_path / "notifier.yaml",
        suppression_window_seconds={"COMMIT_FAILED": WINDOW},
        lag={"enabled": False},
    )
    grpc_port, http_port = free_ports(2)
    svc = ServiceProcess(
        "notifier",
        ["--bootstrap", mesh.bootstrap, "--outbox-path", str(tmp_path / "outbox.sqlite"),
         "--config", str(config)],
        tmp_path / "notifier.log",
        grpc_port,
        http_port,
    )  # fmt: skip
    mesh.services.append(svc)
    return svc


@pytest.mark.slow
def test_reporter_buffers_until_the_notifier_is_up_then_a_storm_is_suppressed(
    mesh: Mesh, kafka_cluster: KafkaHandle, tmp_path: Path
) -> None:
    group = f"storm-{uuid.uuid4().hex[:8]}"
    notifier = notifier_process(mesh, tmp_path)
    reporter = FaultReporter(
        ReporterConfig("sidecar", "sidecar-7", notifier=notifier.grpc_addr),
        CollectorRegistry(),
    )
    reporter.start()
    faults = TopicReader(kafka_cluster.bootstrap, FAULTS_TOPIC, from_end=True)
    try:
        # 1. Reported while no notifier runs: buffered, retried, delivered in order.
        early = [
            reporter.report(
                common_pb2.FAULT_TYPE_POISON_RECORD,
                group=group,
                topic="orders",
                partitions=[i],
                message=f"bad record at partition {i}",
            )
            for i in range(5)
        ]
        time.sleep(1)
        assert reporter.pending == 5
        notifier.start().wait_serving(90)

        def mine(fault_type: int) -> Callable[[list[object]], list[common_pb2.FaultEvent]]:
            return lambda _m: [
                e for e in events(faults.messages) if e.group == group and e.type == fault_type
            ]

        poison = faults.wait(
            lambda m: len(mine(common_pb2.FAULT_TYPE_POISON_RECORD)(m)) >= 5, 60, "buffered"
        )
        assert poison
        delivered = mine(common_pb2.FAULT_TYPE_POISON_RECORD)([])
        assert [e.id for e in delivered] == early
        assert delivered[0].source_service == "sidecar"
        assert delivered[0].severity == common_pb2.SEVERITY_ERROR  # from the catalogue

        # 2. A storm: 1,000 identical COMMIT_FAILED reports in 10 s.
        started = time.monotonic()
        for i in range(1000):
            reporter.report(
                common_pb2.FAULT_TYPE_COMMIT_FAILED,
                group=group,
                consumer_id="sidecar-7",
                message="commit failed: _TRANSPORT",
            )
            time.sleep(max(0.0, started + (i + 1) * 0.01 - time.monotonic()))
        storm_seconds = time.monotonic() - started
        wait_for(lambda: reporter.pending == 0, 60, "the reporter to send the storm")
        # The notifier's windows run on its own clock, from the first report it received
        # to the last: the reporter may have delivered the storm a little behind.
        received_seconds = time.monotonic() - started
        time.sleep(WINDOW + 2)  # the last window's summary

        def is_storm(message: Message) -> bool:
            (event,) = events([message])
            return event.group == group and event.type == common_pb2.FAULT_TYPE_COMMIT_FAILED

        def accounted(_m: list[object]) -> int:
            storm = mine(common_pb2.FAULT_TYPE_COMMIT_FAILED)([])
            reports = sum(1 for e in storm if SUMMARY_ATTRIBUTE not in e.attributes)
            return reports + sum(e.suppressed_count for e in storm)

        faults.wait(lambda m: accounted(m) >= 1000, 60, "all 1,000 reports accounted for")
        storm = mine(common_pb2.FAULT_TYPE_COMMIT_FAILED)([])
        print(
            f"1000 reports in {storm_seconds:.1f} s (all at the notifier after "
            f"{received_seconds:.1f} s) -> {len(storm)} events, suppressed counts "
            f"{[e.suppressed_count for e in storm]}"
        )
        assert accounted([]) == 1000
        # At most one event per window: the first report, then one summary per window.
        assert len(storm) <= math.ceil(received_seconds / WINDOW) + 1
        published_at = [m.timestamp()[1] / 1000 for m in faults.messages if is_storm(m)]
        gaps = [b - a for a, b in itertools.pairwise(published_at)]
        assert all(gap >= WINDOW - 1.0 for gap in gaps), gaps
        assert sum(e.suppressed_count for e in storm) >= 1000 - len(storm)
        assert len({e.id for e in storm}) == len(storm)
        text = metrics(notifier)
        suppressed = metric_value(text, "ds_notifier_faults_suppressed_total", type="COMMIT_FAILED")
        assert suppressed is not None and suppressed >= 1000 - len(storm)
    finally:
        reporter.close()
        faults.close()
