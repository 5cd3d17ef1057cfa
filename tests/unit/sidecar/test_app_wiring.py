"""The sidecar's wiring (app.py's events): what must not depend on the metrics being on."""

from __future__ import annotations

import pytest

from services.consumer_sidecar.app import SidecarApp
from services.consumer_sidecar.settings import SidecarSettings


@pytest.mark.parametrize("metrics", [True, False])
def test_a_commit_found_in_kafka_is_reported_at_once_metrics_or_not(metrics: bool) -> None:
    """A commit this sidecar did not make (issue 23) asks the session for a heartbeat now,
    so the assigner hears of it within a round trip, not at the next interval. The hint
    was wired only when metrics were enabled."""
    app = SidecarApp(
        SidecarSettings(
            group="g",
            id="s1",
            bootstrap="127.0.0.1:1",
            assigner="127.0.0.1:2",
            metrics_enabled=metrics,
        )
    )
    heartbeat_now = app.session._heartbeat_now
    assert not heartbeat_now.is_set()
    app.keeper.committer._events.on_external()
    assert heartbeat_now.is_set()
