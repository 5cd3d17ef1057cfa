"""Lease handoff gaps: the pure tracker (fetch_gaps.HandoffGaps), its Hypothesis
properties, and ``ds_sidecar_handoff_gap_seconds`` as the sidecar's metrics feed and
render it (metrics.SidecarMetrics / NotFetching) on a real partition table."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.fetch_gaps import HandoffGaps
from services.consumer_sidecar.metrics import (
    GAP_LOOK_SECONDS,
    NotFetching,
    SidecarCollector,
    SidecarMetrics,
)
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.consumer_sidecar.stats import BrokerStats, PartitionStats, Statistics
from services.runtime.topic_partition import TP

TP0 = TP("t", 0)
WALL_OFFSET = 1_700_000_000.0  # wall time = monotonic + this, in these tests


def _stats(hwm: int) -> Statistics:
    return Statistics(
        {TP0: PartitionStats(hwm, 0, leader=2, fetch_state="active", fetch_broker=2)},
        {"b2": BrokerStats("127.0.0.1:9094/2", 2, "UP", 0, 0, 0)},
    )


def _handoffs(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            wanted = s.name.startswith("ds_sidecar_handoff_gap_seconds")
            if wanted and "le" not in s.labels and not s.name.endswith("_created"):
                out[s.name] = s.value
    return out


def _granted(table: PartitionTable, at: float) -> Partition:
    """A partition just granted at ``at``, fetching set up at its committed offset 5."""
    part = Partition(TP0, epoch=2, deadline=1e9, acks=PartitionAcks(5), ready=True, position=5)
    part.granted_at = at
    table.add(part)
    return part


def test_a_handoff_shorter_than_the_gap_floor_is_counted_on_the_new_owner() -> None:
    # The sidecar's own wiring: a partition granted, the statistics showing records waiting,
    # its first records 0.4 s after the grant (well under the 1 s not-fetching floor).
    granted = time.monotonic()
    table = PartitionTable(1 << 20, time.monotonic)
    _granted(table, granted)
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry, "g")
    metrics.watch(table, time.monotonic, lambda: True)
    gaps = metrics.gaps
    assert gaps is not None
    gaps.tick(granted)
    metrics.statistics(_stats(500))  # 495 records wait
    gaps.tick(granted + GAP_LOOK_SECONDS)
    gaps.fetched(TP0, granted + 0.4)
    scraped = _handoffs(registry)
    assert scraped["ds_sidecar_handoff_gap_seconds_count"] == 1.0
    assert abs(scraped["ds_sidecar_handoff_gap_seconds_sum"] - 0.4) < 1e-9
    gaps.fetched(TP0, granted + 0.5)  # later records: the handoff is over, counted once
    assert _handoffs(registry)["ds_sidecar_handoff_gap_seconds_count"] == 1.0


def _not_fetching(
    table: PartitionTable, clock: list[float]
) -> tuple[NotFetching, CollectorRegistry, SidecarCollector]:
    registry = CollectorRegistry()
    view = SidecarCollector("g", table, lambda: clock[0], lambda: True, lambda: clock[0])
    labels = ["group", "topic", "partition"]
    gaps = NotFetching(
        "g", table, view.statistics,
        Histogram("ds_partition_not_fetching_seconds", "h", labels, registry=registry),
        Histogram("ds_sidecar_handoff_gap_seconds", "h", labels, registry=registry),
        wall_offset=lambda: WALL_OFFSET,
    )  # fmt: skip
    return gaps, registry, view


def test_records_written_after_the_grant_did_not_wait_so_there_is_no_handoff_gap() -> None:
    clock = [100.0]
    table = PartitionTable(1 << 20, lambda: clock[0])
    _granted(table, 100.0)
    gaps, registry, _view = _not_fetching(table, clock)
    gaps.tick(100.0)
    written_ms = int((102.0 + WALL_OFFSET) * 1000)  # produced 2 s after the grant
    gaps.fetched(TP0, 102.1, written_ms)
    assert "ds_sidecar_handoff_gap_seconds_count" not in _handoffs(registry)


def test_records_written_before_the_grant_waited_for_it() -> None:
    clock = [100.0]
    table = PartitionTable(1 << 20, lambda: clock[0])
    _granted(table, 100.0)
    gaps, registry, _view = _not_fetching(table, clock)
    written_ms = int((99.0 + WALL_OFFSET) * 1000)
    gaps.fetched(TP0, 100.3, written_ms)  # before any look saw the grant: still counted
    scraped = _handoffs(registry)
    assert scraped["ds_sidecar_handoff_gap_seconds_count"] == 1.0
    assert abs(scraped["ds_sidecar_handoff_gap_seconds_sum"] - 0.3) < 1e-9


def test_a_partition_seen_at_its_end_after_the_grant_had_nothing_waiting() -> None:
    clock = [100.0]
    table = PartitionTable(1 << 20, lambda: clock[0])
    _granted(table, 100.0)
    gaps, registry, view = _not_fetching(table, clock)
    gaps.tick(clock[0])
    clock[0] += 1.0
    view.apply_statistics(_stats(5))  # at its end (position 5 = high watermark)
    gaps.tick(clock[0])
    gaps.fetched(TP0, clock[0] + 3.0)  # a record produced later
    assert "ds_sidecar_handoff_gap_seconds_count" not in _handoffs(registry)


def test_statistics_from_before_the_grant_do_not_end_its_handoff() -> None:
    clock = [100.0]
    table = PartitionTable(1 << 20, lambda: clock[0])
    gaps, registry, view = _not_fetching(table, clock)
    view.apply_statistics(_stats(5))  # at its end, emitted at 100.0: before the grant
    _granted(table, 100.5)
    clock[0] = 100.75
    gaps.tick(clock[0])
    gaps.fetched(TP0, 101.0)
    assert _handoffs(registry)["ds_sidecar_handoff_gap_seconds_count"] == 1.0


def test_a_partition_paused_on_purpose_after_its_grant_ends_the_handoff_uncounted() -> None:
    clock = [100.0]
    table = PartitionTable(1 << 20, lambda: clock[0])
    part = _granted(table, 100.0)
    gaps, registry, _view = _not_fetching(table, clock)
    part.paused = True
    gaps.tick(100.1)
    gaps.fetched(TP0, 103.0)
    assert "ds_sidecar_handoff_gap_seconds_count" not in _handoffs(registry)


def test_a_new_grant_opens_a_new_handoff_and_a_release_forgets_the_open_one() -> None:
    handoffs: HandoffGaps[str] = HandoffGaps()
    handoffs.held([("a", 1.0), ("b", 1.0)])
    assert handoffs.fetched("a", 1.5, 1.0, waited=True) == 0.5
    handoffs.held([("a", 4.0)])  # a granted again (new epoch); b released
    assert handoffs.fetched("b", 5.0, 4.5, waited=True) == 0.5  # b granted anew, unseen
    assert handoffs.fetched("a", 4.25, 4.0, waited=True) == 0.25
    assert handoffs.fetched("a", 4.5, 4.0, waited=True) is None


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["grant", "fetch", "idle", "release"]),
            st.floats(0.0, 5.0),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_each_grant_gives_at_most_one_gap_within_the_time_since_it(
    steps: list[tuple[str, float, bool]],
) -> None:
    # As NotFetching asks: records of a held partition only, with the grant it is held by.
    handoffs: HandoffGaps[str] = HandoffGaps()
    now, grant = 0.0, 0.0
    held = True
    counted: dict[float, int] = {}
    for kind, advance, waited in steps:
        now += advance
        if kind == "grant":
            grant, held = now, True
            handoffs.held([("k", grant)])
        elif kind == "release":
            held = False
            handoffs.held([])
        elif kind == "idle":
            handoffs.idle("k", now)
        elif held:
            gap = handoffs.fetched("k", now, grant, waited)
            if gap is not None:
                assert waited and gap == now - grant
                counted[grant] = counted.get(grant, 0) + 1
    assert all(n == 1 for n in counted.values())
