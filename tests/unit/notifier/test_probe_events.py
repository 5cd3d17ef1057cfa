"""The probe's settings, fault events and metric names (the pure parts of the probe)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dataservice.common.v1 import common_pb2
from services.notifier.metrics import ProbeMetrics
from services.notifier.probe import fault_event, new_instance_id
from services.notifier.probe_tracker import FaultChange
from services.notifier.settings import NotifierSettings, ProbeSettings
from services.runtime import faults
from services.runtime.settings import ConfigError, load_settings


def test_the_probe_is_off_by_default_with_documented_defaults() -> None:
    probe = NotifierSettings().probe
    assert probe == ProbeSettings()
    assert not probe.enabled
    assert (probe.topic, probe.group) == ("ds.probe", "ds-probe")
    assert (probe.interval_seconds, probe.timeout_seconds) == (5.0, 30.0)


def test_probe_settings_come_from_env_and_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_PROBE__ENABLED", "true")
    monkeypatch.setenv("DS_PROBE__INTERVAL_SECONDS", "1")
    loaded = load_settings(NotifierSettings, {}, None)
    assert loaded.probe.enabled and loaded.probe.interval_seconds == 1.0
    monkeypatch.setenv("DS_PROBE__ASSIGNER", "not-an-address")
    with pytest.raises(ConfigError, match=r"probe\.assigner"):
        load_settings(NotifierSettings, {}, None)
    monkeypatch.delenv("DS_PROBE__ASSIGNER")
    monkeypatch.setenv("DS_PROBE__TIMEOUT_SECONDS", "0")
    with pytest.raises(ConfigError, match=r"probe\.timeout_seconds"):
        load_settings(NotifierSettings, {}, None)


def test_instance_ids_differ_per_run() -> None:
    a, b = new_instance_id("host"), new_instance_id("host")
    assert a != b and a.startswith("host-") and b.startswith("host-")


def test_open_and_resolved_events_share_a_key_and_name_the_partitions() -> None:
    settings = ProbeSettings(enabled=True, topic="t.probe", group="g-probe", timeout_seconds=5)
    opened = fault_event(FaultChange(True, (0, 2), 3), settings, "notifier-1")
    resolved = fault_event(FaultChange(False, (0, 1, 2), 7), settings, "notifier-1")
    assert opened.type == resolved.type == common_pb2.FAULT_TYPE_PROBE_LOST
    assert opened.state == common_pb2.FAULT_STATE_OPEN
    assert resolved.state == common_pb2.FAULT_STATE_RESOLVED
    assert opened.dedupe_key == resolved.dedupe_key == "PROBE_LOST|g-probe|t.probe"
    assert opened.severity == faults.CATALOGUE[common_pb2.FAULT_TYPE_PROBE_LOST].severity
    assert (opened.group, opened.topic) == ("g-probe", "t.probe")
    assert list(opened.partitions) == [0, 2] and list(resolved.partitions) == [0, 1, 2]
    assert opened.attributes["lost"] == "3" and resolved.attributes["lost"] == "7"
    assert "3 probe(s) not consumed" in opened.message and "within 5 s" in opened.message
    assert opened.source_service == "notifier" and opened.source_instance == "notifier-1"


def test_probe_lost_is_a_notifier_fault() -> None:
    spec = faults.CATALOGUE[common_pb2.FAULT_TYPE_PROBE_LOST]
    assert spec.who == "notifier" and spec.name == "PROBE_LOST"
    assert faults.parse_type("probe_lost") == common_pb2.FAULT_TYPE_PROBE_LOST


def test_probe_metrics_follow_the_contract_names() -> None:
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    metrics.sent.labels("0").inc()
    metrics.lost.labels("0").inc()
    metrics.roundtrip.observe(0.02)
    text = generate_latest(registry).decode()
    for line in (
        'ds_probe_sent_total{partition="0"} 1.0',
        "ds_probe_received_total 0.0",
        'ds_probe_lost_total{partition="0"} 1.0',
        "ds_probe_late_total 0.0",
        "ds_probe_produce_errors_total 0.0",
        "ds_probe_roundtrip_seconds_count 1.0",
        "ds_probe_last_success_timestamp_seconds 0.0",
        "# TYPE ds_probe_roundtrip_seconds histogram",
    ):
        assert line in text
