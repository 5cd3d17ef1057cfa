"""The shared reporter's buffer and tracking (pure logic: a reporter that is never started
keeps what it would send)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataservice.common.v1 import common_pb2
from services.consumer_sidecar.settings import SidecarSettings
from services.runtime.reporter import FaultReporter, reporter_for
from tests.support.fault_reports import kinds, reporter

T = common_pb2


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


def test_fault_reports_carry_the_notifier_token_when_one_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 37 (tokens scoped by audience): an injected sidecar's DS_TLS__TOKEN_FILE is its
    ``ds-assigner`` token, refused by the notifier; DS_TLS__NOTIFIER_TOKEN_FILE (its
    ``ds-notifier`` token) is what its fault reports carry. Without it, the one token."""
    monkeypatch.setenv("DS_TLS__CA_FILE", "/sa/ca.crt")
    monkeypatch.setenv("DS_TLS__TOKEN_FILE", "/sa/token")
    settings = SidecarSettings(group="g", id="pod-a")
    assert reporter_for(settings, "sidecar", "pod-a", None).config.connection.tls.token_file == (
        Path("/sa/token")
    )
    monkeypatch.setenv("DS_TLS__NOTIFIER_TOKEN_FILE", "/sa/notifier-token")
    settings = SidecarSettings(group="g", id="pod-a")
    tls = reporter_for(settings, "sidecar", "pod-a", None).config.connection.tls
    assert (tls.token_file, tls.ca_file) == (Path("/sa/notifier-token"), Path("/sa/ca.crt"))
    assert settings.connection.tls.token_file == Path("/sa/token")  # the assigner's: unchanged
