"""The sidecar's wiring (app.py's events): what must not depend on the metrics being on, and
what the metrics make only after the parts that feed them."""

from __future__ import annotations

import pytest

from services.consumer_sidecar.app import SidecarApp
from services.consumer_sidecar.settings import SidecarSettings
from services.runtime.topic_partition import TP


def sidecar(metrics: bool) -> SidecarApp:
    return SidecarApp(
        SidecarSettings(
            group="g",
            id="s1",
            bootstrap="127.0.0.1:1",
            assigner="127.0.0.1:2",
            metrics_enabled=metrics,
        )
    )


@pytest.mark.parametrize("metrics", [True, False])
def test_a_commit_found_in_kafka_is_reported_at_once_metrics_or_not(metrics: bool) -> None:
    """A commit this sidecar did not make (issue 23) asks the session for a heartbeat now,
    so the assigner hears of it within a round trip, not at the next interval. The hint
    was wired only when metrics were enabled."""
    app = sidecar(metrics)
    heartbeat_now = app.session._heartbeat_now
    assert not heartbeat_now.is_set()
    app.keeper.committer._events.on_external()
    assert heartbeat_now.is_set()


class Gaps:
    """Stands in for the metrics' not-fetching gaps: what the fetch loop told them."""

    def __init__(self) -> None:
        self.told: list[tuple[str, object]] = []

    def fetched(self, tp: TP, at: float, first_timestamp_ms: int = -1) -> None:
        self.told.append(("fetched", tp))

    def tick(self, now: float) -> None:
        self.told.append(("tick", now))


def test_the_fetch_loop_feeds_the_not_fetching_gaps_made_after_it() -> None:
    """``ds_partition_not_fetching_seconds`` and ``ds_sidecar_handoff_gap_seconds`` are fed
    by the fetch loop's hooks; the gaps are made once the fetcher exists (their view reads
    its last poll). Hooks bound when the fetcher was built saw no gaps and fed nothing
    (CI, 2 Dec: tests/e2e/test_handoff_gap_and_fetch_metrics.py, B counted {})."""
    app = sidecar(metrics=True)
    assert app.metrics.gaps is not None
    gaps = Gaps()
    app.metrics.gaps = gaps  # type: ignore[assignment]
    events = app.fetcher._events
    events.on_fetched(TP("t", 0), 1.0, -1)
    events.on_loop(2.0)
    assert gaps.told == [("fetched", TP("t", 0)), ("tick", 2.0)]
