"""Not-fetching gaps: the pure tracker (fetch_gaps.py), its Hypothesis properties, and the
metrics that feed and render it (metrics.NotFetching) on a real partition table."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.fetch_gaps import GapTracker, wants_records
from services.consumer_sidecar.metric_table import GAP_BUCKETS
from services.consumer_sidecar.metrics import GAP_LOOK_SECONDS, NotFetching, SidecarCollector
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.consumer_sidecar.stats import BrokerStats, PartitionStats, Statistics
from services.runtime.topic_partition import TP

TP0 = TP("t", 0)


def _wants(position: int = 10, hwm: int = 10, leader: int = 1, state: str | None = "UP",
           fetch: str = "active") -> bool:  # fmt: skip
    return wants_records(
        position=position, high_watermark=hwm, leader=leader, leader_state=state,
        fetch_state=fetch,
    )  # fmt: skip


def test_a_partition_wants_records_when_behind_or_when_it_cannot_fetch() -> None:
    assert not _wants()  # at its end, leader up, fetching: not a gap however long
    assert not _wants(hwm=-1)  # end unknown, leader up: nothing says records wait
    assert _wants(position=5)  # behind its end
    assert _wants(leader=-1)  # no leader known
    assert _wants(state="DOWN") and _wants(state="CONNECT") and _wants(state=None)
    assert _wants(fetch="offset-query")  # librdkafka not fetching it


def test_a_dead_leader_gap_runs_from_the_last_record_to_the_next() -> None:
    gaps: GapTracker[str] = GapTracker(floor=1.0)
    gaps.held(["p"], 0.0)
    for t in (0.1, 0.2, 3.0):
        assert gaps.fetched("p", t) is None
    assert gaps.look("p", 2.5, wanting=False) is None  # statistics older than the last record
    assert gaps.current("p", 5.0) == 0.0  # nothing says it wants records yet
    assert gaps.look("p", 4.0, wanting=True) is None  # statistics: the leader is down
    assert gaps.current("p", 5.0) == 2.0  # since the last record, at 3.0
    assert gaps.current("p", 13.0) == 10.0
    assert gaps.fetched("p", 14.5) == 11.5  # records again: the gap ends
    assert gaps.current("p", 14.6) == 0.0


def test_short_waits_are_no_gap_and_a_caught_up_partition_is_never_in_one() -> None:
    gaps: GapTracker[str] = GapTracker(floor=1.0)
    gaps.held(["p"], 0.0)
    gaps.look("p", 0.0, wanting=True)
    assert gaps.fetched("p", 0.5) is None  # below the floor
    assert gaps.current("p", 1.25) == 0.0
    assert gaps.current("p", 1.75) == 1.25
    for t in (2.0, 10.0, 100.0):  # at its end with a live leader: idle, not stuck
        assert gaps.look("p", t, wanting=False) == (1.5 if t == 2.0 else None)
    assert gaps.current("p", 500.0) == 0.0


def test_a_pause_on_purpose_or_a_release_ends_the_gap() -> None:
    gaps: GapTracker[str] = GapTracker(floor=1.0)
    gaps.held(["p", "q"], 0.0)
    gaps.look("p", 0.0, wanting=True)
    gaps.look("q", 0.0, wanting=True)
    assert gaps.look("p", 4.0, wanting=False) == 4.0  # backpressure paused it
    assert gaps.held(["p"], 6.0) == [("q", 6.0)]  # q released in its gap
    assert "q" not in gaps and gaps.current("q", 7.0) == 0.0
    assert gaps.held(["p", "q"], 8.0) == []  # granted back: a fresh start
    assert gaps.current("q", 20.0) == 0.0


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["fetched", "look", "release", "hold"]),
        st.sampled_from(["p", "q"]),
        st.floats(0.0, 5.0),  # time step
        st.floats(0.0, 5.0),  # how old a look's information is
        st.booleans(),
    ),
    max_size=60,
)


@given(EVENTS)
def test_gaps_are_at_least_the_floor_disjoint_and_within_the_time_held(
    events: list[tuple[str, str, float, float, bool]],
) -> None:
    floor = 1.0
    gaps: GapTracker[str] = GapTracker(floor=floor)
    now = 0.0
    held_since: dict[str, float] = {}
    last_end: dict[str, float] = {}
    for kind, key, step, age, wanting in events:
        now += step
        ended: list[tuple[str, float, float]] = []  # (key, end, length)
        before = dict(held_since)
        if kind in ("release", "hold"):
            keys = set(held_since) - {key} if kind == "release" else set(held_since) | {key}
            ended += [(k, now, g) for k, g in gaps.held(keys, now)]
            held_since = {k: held_since.get(k, now) for k in keys}
        elif key in held_since:
            if kind == "fetched":
                gap = gaps.fetched(key, now)
                assert gaps.current(key, now) == 0.0
                at = now
            else:
                at = max(held_since[key], now - age)  # statistics taken while it was held
                gap = gaps.look(key, at, wanting)
            if gap is not None:
                ended.append((key, at, gap))
        for k, end, length in ended:
            assert length >= floor
            start = end - length
            assert start >= before[k] - 1e-9  # within the time it was held
            assert start >= last_end.get(k, float("-inf")) - 1e-9  # gaps never overlap
            last_end[k] = end
        for k in ("p", "q"):
            current = gaps.current(k, now)
            assert current == 0.0 or current >= floor
            if k in held_since:
                assert current <= now - held_since[k] + 1e-9
            else:
                assert current == 0.0


# ---- the metrics: a real partition table, statistics, the Prometheus rendering -------------


def _stats(leader_state: str, hwm: int) -> Statistics:
    return Statistics(
        {TP0: PartitionStats(hwm, 0, leader=2, fetch_state="active")},
        {"b2": BrokerStats("127.0.0.1:9094/2", 2, leader_state, 0, 0, 0)},
    )


def _scrape(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("ds_partition_not_fetching") and not s.name.endswith("_created"):
                key = s.name + (f"[{s.labels['le']}]" if "le" in s.labels else "")
                out[key] = s.value
    return out


def test_a_leader_outage_shows_in_the_gauge_and_ends_in_the_histogram() -> None:
    clock = [100.0]
    table = PartitionTable(1 << 20, lambda: clock[0])
    part = Partition(TP0, epoch=1, deadline=1e9, acks=PartitionAcks(0), ready=True, position=50)
    table.add(part)
    registry = CollectorRegistry()
    view = SidecarCollector("g", table, lambda: clock[0], lambda: True, lambda: clock[0])
    histogram = Histogram(
        "ds_partition_not_fetching_seconds", "h", ["group", "topic", "partition"],
        buckets=GAP_BUCKETS, registry=registry,
    )  # fmt: skip
    view.gaps = gaps = NotFetching("g", table, view.statistics, histogram)
    registry.register(view)

    def step(seconds: float) -> None:
        for _ in range(int(seconds / GAP_LOOK_SECONDS)):
            clock[0] += GAP_LOOK_SECONDS
            gaps.tick(clock[0])

    view.apply_statistics(_stats("UP", 50))
    gaps.fetched(TP0, clock[0])
    step(2.0)  # at its end, leader up
    assert _scrape(registry)["ds_partition_not_fetching_current_seconds"] == 0.0
    view.apply_statistics(_stats("TRY_CONNECT", 50))  # the leader died
    step(6.0)
    scraped = _scrape(registry)
    assert scraped["ds_partition_not_fetching_current_seconds"] == 8.0  # since the record
    assert "ds_partition_not_fetching_seconds_count" not in scraped  # still open
    gaps.fetched(TP0, clock[0] + 0.5)  # the new leader serves records
    scraped = _scrape(registry)
    assert scraped["ds_partition_not_fetching_current_seconds"] == 0.0
    assert scraped["ds_partition_not_fetching_seconds_count"] == 1.0
    assert scraped["ds_partition_not_fetching_seconds_sum"] == 8.5
    assert scraped["ds_partition_not_fetching_seconds_bucket[10.0]"] == 1.0
    assert scraped["ds_partition_not_fetching_seconds_bucket[5.0]"] == 0.0


def test_a_partition_paused_by_backpressure_is_not_in_a_gap() -> None:
    clock = [0.0]
    table = PartitionTable(1 << 20, lambda: clock[0])
    part = Partition(TP0, epoch=1, deadline=1e9, acks=PartitionAcks(0), ready=True, position=5)
    table.add(part)
    view = SidecarCollector("g", table, lambda: clock[0], lambda: True, lambda: clock[0])
    registry = CollectorRegistry()
    histogram = Histogram(
        "ds_partition_not_fetching_seconds", "h", ["group", "topic", "partition"],
        registry=registry,
    )  # fmt: skip
    gaps = NotFetching("g", table, view.statistics, histogram)
    view.apply_statistics(_stats("UP", 500))  # far behind its end
    part.paused = True
    for _ in range(40):
        clock[0] += GAP_LOOK_SECONDS
        gaps.tick(clock[0])
    assert gaps.current(TP0, clock[0]) == 0.0
    part.paused = False  # resumed: records come within the floor
    clock[0] += GAP_LOOK_SECONDS
    gaps.tick(clock[0])
    gaps.fetched(TP0, clock[0] + 0.1)
    assert gaps.current(TP0, clock[0] + 0.1) == 0.0
    assert "ds_partition_not_fetching_seconds_count" not in _scrape(registry)


def test_a_slow_set_up_after_a_grant_is_part_of_the_gap() -> None:
    clock = [0.0]
    table = PartitionTable(1 << 20, lambda: clock[0])
    part = Partition(TP0, epoch=1, deadline=1e9, acks=PartitionAcks(0))  # granted, not ready
    table.add(part)
    view = SidecarCollector("g", table, lambda: clock[0], lambda: True, lambda: clock[0])
    registry = CollectorRegistry()
    histogram = Histogram(
        "ds_partition_not_fetching_seconds", "h", ["group", "topic", "partition"],
        registry=registry,
    )  # fmt: skip
    gaps = NotFetching("g", table, view.statistics, histogram)
    gaps.tick(clock[0])  # seen at the grant
    for _ in range(8):  # 2 s setting fetching up (Kafka slow to answer committed())
        clock[0] += GAP_LOOK_SECONDS
        gaps.tick(clock[0])
    part.ready, part.position = True, 5
    view.apply_statistics(_stats("UP", 500))  # behind its end, nothing fetched yet
    clock[0] += GAP_LOOK_SECONDS
    gaps.tick(clock[0])
    assert gaps.current(TP0, clock[0]) == 2.25
    gaps.fetched(TP0, clock[0] + 0.25)
    assert _scrape(registry)["ds_partition_not_fetching_seconds_sum"] == 2.5
