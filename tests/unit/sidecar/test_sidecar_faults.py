"""The sidecar's fault hooks (pure logic: a reporter that is never started keeps what it
would send)."""

from __future__ import annotations

from services.consumer_sidecar.fault_emitters import SidecarFaults
from tests.support.fault_reports import kinds, reporter


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
