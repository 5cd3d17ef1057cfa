"""The end-to-end probe on the real stack: the notifier creates the probe topic and the
leased probe group, produces a probe per partition every second and consumes them back
through the assigner and a sidecar. Round trips are exported; a SIGSTOPped sidecar makes
probes go lost (metric and PROBE_LOST fault), and after SIGCONT probes flow again, the
ones produced meanwhile arrive late and PROBE_LOST resolves."""

from __future__ import annotations

import math
import signal
import uuid
from pathlib import Path

import pytest

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.devstack.kafka import KafkaHandle
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.notifier import (
    metric_value,
    notifier_config,
    notifier_stub,
    start_notifier,
)
from tests.support.ops import metrics
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

PARTITIONS = 2
INTERVAL, TIMEOUT = 1.0, 5.0


def metric_sum(text: str, name: str) -> float:
    """The sum of every series of ``name`` (all label values)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rpartition(" ")[2])
    return total


def probe_faults(
    notifier: ServiceProcess, group: str, *, open_only: bool = False
) -> list[common_pb2.FaultEvent]:
    with notifier_stub(notifier.grpc_addr) as stub:
        response = stub.ListFaults(
            notifier_pb2.ListFaultsRequest(
                group=group,
                types=[common_pb2.FAULT_TYPE_PROBE_LOST],
                open_only=open_only,
                page_size=1000,
            ),
            timeout=5,
        )
    return list(response.faults)


def test_probe_round_trips_and_reports_lost_probes_of_a_stopped_sidecar(
    kafka_cluster: KafkaHandle, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"probe-{suffix}", f"probe-{suffix}"
    with running_mesh(kafka_cluster.bootstrap, tmp_path) as mesh:
        assigner = mesh.assigner([])  # no groups: the notifier creates the probe group
        config = notifier_config(
            tmp_path / "notifier.yaml",
            lag={"enabled": False},
            probe={
                "enabled": True,
                "topic": topic,
                "group": group,
                "partitions": PARTITIONS,
                "interval_seconds": INTERVAL,
                "timeout_seconds": TIMEOUT,
                "assigner": assigner.grpc_addr,
            },
        )
        notifier = start_notifier(mesh, tmp_path / "outbox.sqlite", config)
        sidecar = mesh.sidecar(group, assigner, "probe-sidecar")
        for svc in (assigner, notifier, sidecar):
            svc.wait_serving(90)

        def roundtrips() -> tuple[float, float] | None:
            text = metrics(notifier)
            count = metric_value(text, "ds_probe_roundtrip_seconds_count") or 0.0
            total = metric_value(text, "ds_probe_roundtrip_seconds_sum")
            if (metric_value(text, "ds_probe_received_total") or 0.0) > 0 and count > 0:
                assert total is not None
                return count, total
            return None

        count, total = wait_for(roundtrips, 60, "probes received through the mesh")
        assert math.isfinite(total) and total > 0
        text = metrics(notifier)
        for partition in range(PARTITIONS):
            sent = metric_value(text, "ds_probe_sent_total", partition=str(partition))
            assert sent is not None and sent >= 1
        assert (metric_value(text, "ds_probe_last_success_timestamp_seconds") or 0.0) > 0
        assert (metric_value(text, "ds_probe_produce_errors_total") or 0.0) == 0

        # Start-up (the sidecar's first leases) may have lost a probe on a slow machine:
        # the SIGSTOP episode must start from a closed PROBE_LOST.
        wait_for(
            lambda: not probe_faults(notifier, group, open_only=True),
            60,
            "no PROBE_LOST open before the stop",
        )
        # Stop the sidecar serving the probe group for longer than the probe timeout.
        lost_before = metric_sum(text, "ds_probe_lost_total")
        known_before = {e.id for e in probe_faults(notifier, group)}
        sidecar.signal(signal.SIGSTOP)
        try:
            wait_for(
                lambda: metric_sum(metrics(notifier), "ds_probe_lost_total") > lost_before,
                60,
                "probes counted lost while the sidecar is stopped",
            )
            opened = wait_for(
                lambda: [
                    e
                    for e in probe_faults(notifier, group)
                    if e.state == common_pb2.FAULT_STATE_OPEN and e.id not in known_before
                ],
                30,
                "a PROBE_LOST fault listed by the notifier",
            )[0]
            assert opened.topic == topic and opened.source_service == "notifier"
            assert set(opened.partitions) <= set(range(PARTITIONS)) and opened.partitions
            received_stopped = metric_value(metrics(notifier), "ds_probe_received_total") or 0.0
        finally:
            sidecar.signal(signal.SIGCONT)

        wait_for(
            lambda: (
                (metric_value(metrics(notifier), "ds_probe_received_total") or 0.0)
                > received_stopped
            ),
            90,
            "probes received again after SIGCONT",
        )
        # What was produced during the stop is still delivered (at least once), late.
        wait_for(
            lambda: (metric_value(metrics(notifier), "ds_probe_late_total") or 0.0) > 0,
            60,
            "the probes produced during the stop to arrive late",
        )
        resolved = wait_for(
            lambda: [
                e
                for e in probe_faults(notifier, group)
                if e.state == common_pb2.FAULT_STATE_RESOLVED and e.dedupe_key == opened.dedupe_key
            ],
            60,
            "PROBE_LOST resolved",
        )[0]
        assert resolved.detected_at.ToNanoseconds() >= opened.detected_at.ToNanoseconds()
        # One episode: the stop's probes expiring one round after another while new ones
        # arrive on time must not reopen the fault at every round.
        episode = [e for e in probe_faults(notifier, group) if e.id not in known_before]
        assert [e.state for e in episode] == [
            common_pb2.FAULT_STATE_RESOLVED,
            common_pb2.FAULT_STATE_OPEN,
        ]  # newest first
        final = metrics(notifier)
        assert (metric_value(final, "ds_probe_roundtrip_seconds_count") or 0.0) > count
