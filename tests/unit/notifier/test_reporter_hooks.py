"""The shared reporter's buffer and the assigner's and sidecar's fault hooks (pure logic:
a reporter that is never started keeps what it would send)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

from prometheus_client import CollectorRegistry

from dataservice.common.v1 import common_pb2
from services.runtime.reporter import (
    FaultReporter,
    GroupFaults,
    ReporterConfig,
    SidecarFaults,
)

OPEN, RESOLVED = common_pb2.FAULT_STATE_OPEN, common_pb2.FAULT_STATE_RESOLVED
T = common_pb2


def reporter(capacity: int = 100) -> FaultReporter:
    # Never started: report() only stamps and buffers.
    return FaultReporter(
        ReporterConfig("assigner", "node-1", notifier="127.0.0.1:1", capacity=capacity),
        CollectorRegistry(),
    )


def kinds(r: FaultReporter) -> list[tuple[str, str]]:
    return [
        (T.FaultType.Name(e.type).removeprefix("FAULT_TYPE_"), T.FaultState.Name(e.state)[12:])
        for e in r.buffered()
    ]


def test_report_stamps_the_event_and_takes_severity_from_the_catalogue() -> None:
    r = reporter()
    event_id = r.report(T.FAULT_TYPE_BROKER_UNREACHABLE, group="g", attributes={"error": 3})
    (event,) = r.buffered()
    assert event.id == event_id and len(event_id) == 36
    assert event.severity == T.SEVERITY_CRITICAL
    assert (event.source_service, event.source_instance) == ("assigner", "node-1")
    assert event.HasField("detected_at") and event.attributes["error"] == "3"


def test_a_full_buffer_drops_the_oldest_and_counts_it() -> None:
    r = reporter(capacity=3)
    ids = [r.report(T.FAULT_TYPE_POISON_RECORD, group=str(i)) for i in range(5)]
    assert [e.id for e in r.buffered()] == ids[2:]
    assert r.dropped == 2


def test_a_disabled_reporter_keeps_nothing() -> None:
    r = FaultReporter.disabled("sidecar")
    r.report(T.FAULT_TYPE_COMMIT_FAILED)
    assert not r.enabled and r.pending == 0


def test_track_reports_transitions_only() -> None:
    r = reporter()
    for active in (True, True, False, False, True):
        r.track("k", active, T.FAULT_TYPE_CLIENT_BACKPRESSURE, group="g", dedupe_key="dk")
    assert kinds(r) == [
        ("CLIENT_BACKPRESSURE", "OPEN"),
        ("CLIENT_BACKPRESSURE", "RESOLVED"),
        ("CLIENT_BACKPRESSURE", "OPEN"),
    ]
    assert {e.dedupe_key for e in r.buffered()} == {"dk"}


class State(Enum):
    GRANTED = 1
    FREE = 2


@dataclass
class Lease:
    state: State


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


def test_group_faults_lost_moved_and_back() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    faults.granted([(TP("t", 0), "a"), (TP("t", 1), "a")], [Lease(State.GRANTED)] * 2)
    assert kinds(r) == []  # first grants move nothing
    faults.lost("a")
    faults.granted([(TP("t", 0), "b"), (TP("t", 1), "b")], [Lease(State.GRANTED)] * 2)
    faults.joined("a")
    faults.joined("a")
    assert kinds(r) == [
        ("CONSUMER_LOST", "OPEN"),
        ("PARTITIONS_REASSIGNED", "OPEN"),
        ("PARTITIONS_REASSIGNED", "RESOLVED"),
        ("CONSUMER_LOST", "RESOLVED"),
    ]
    moved = r.buffered()[1]
    assert (moved.topic, list(moved.partitions)) == ("t", [0, 1])
    assert dict(moved.attributes) == {"from": "a", "to": "b"}
    lost, resolved = r.buffered()[0], r.buffered()[3]
    assert lost.consumer_id == resolved.consumer_id == "a"
    assert lost.dedupe_key == resolved.dedupe_key


def test_reassignment_resolves_only_when_every_partition_is_held() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    faults.granted([(TP("t", 0), "a")], [Lease(State.GRANTED)])
    faults.granted([(TP("t", 0), "b")], [Lease(State.GRANTED), Lease(State.FREE)])
    faults.granted([], [Lease(State.GRANTED), Lease(State.GRANTED)])
    assert kinds(r) == [("PARTITIONS_REASSIGNED", "OPEN"), ("PARTITIONS_REASSIGNED", "RESOLVED")]


def test_group_faults_left_and_rebound() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    faults.rebound({"a", "b"}, clients=2)  # the first binding: nothing moved
    faults.left("b")
    faults.rebound({"a"}, clients=2)
    faults.rebound({"a"}, clients=2)  # unchanged
    faults.rebound({"a", "c"}, clients=0)  # no client to rebind
    assert kinds(r) == [
        ("CONSUMER_LEFT", "OPEN"),
        ("CLIENT_REBOUND", "OPEN"),
        ("CLIENT_REBOUND", "RESOLVED"),
    ]
    assert r.buffered()[1].attributes["removed"] == "b"


def test_sidecar_faults() -> None:
    r = reporter()
    faults = SidecarFaults(r, "g", "sidecar-1")
    faults.kafka_error("_TRANSPORT", "broker down")
    faults.kafka_error("_ALL_BROKERS_DOWN", "all down")  # still the same outage
    faults.brokers_up('{"brokers":{"b":{"state":"DOWN"}}}')
    faults.brokers_up('{"brokers":{"b":{"state":"UP"}}}')
    faults.kafka_error("_BAD_MSG", "corrupt record")
    faults.kafka_error("_PARTITION_EOF", "not a fault")
    faults.commit(RuntimeError("timed out"))
    faults.commit(RuntimeError("timed out"))
    faults.commit(None)
    faults.commit(None)
    faults.backpressure([("t", 0), ("t", 1)])
    faults.backpressure([("t", 1)])
    assert kinds(r) == [
        ("BROKER_UNREACHABLE", "OPEN"),
        ("BROKER_UNREACHABLE", "RESOLVED"),
        ("POISON_RECORD", "OPEN"),
        ("COMMIT_FAILED", "OPEN"),
        ("COMMIT_FAILED", "OPEN"),  # every failure: the notifier suppresses and counts
        ("COMMIT_FAILED", "RESOLVED"),
        ("CLIENT_BACKPRESSURE", "OPEN"),
        ("CLIENT_BACKPRESSURE", "OPEN"),
        ("CLIENT_BACKPRESSURE", "RESOLVED"),
    ]
    events = r.buffered()
    assert events[5].dedupe_key == events[3].dedupe_key == "COMMIT_FAILED|g|sidecar-1"
    assert events[5].group == "g" and events[5].consumer_id == "sidecar-1"
    assert (events[8].topic, list(events[8].partitions)) == ("t", [0])


def test_failover_opens_now_and_resolves_after_the_settle_period() -> None:
    r = reporter()
    r.failover("10.0.0.2:7070", settle_seconds=0.2)
    assert kinds(r) == [("ASSIGNER_FAILOVER", "OPEN")]
    deadline = time.monotonic() + 5
    while r.pending < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kinds(r) == [("ASSIGNER_FAILOVER", "OPEN"), ("ASSIGNER_FAILOVER", "RESOLVED")]
    assert r.buffered()[0].attributes["leader"] == "10.0.0.2:7070"
