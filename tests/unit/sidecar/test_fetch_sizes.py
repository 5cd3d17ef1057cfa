"""Fetch sizes per topic from librdkafka's statistics (fetch_sizes.py), the statistics
fields they read (stats.py), and the per-partition fetch broker gauges (metrics.py)."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.fetch_sizes import FetchSizes, FetchWindow
from services.consumer_sidecar.metrics import SidecarMetrics
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.consumer_sidecar.stats import (
    BrokerStats,
    PartitionStats,
    Statistics,
    parse_statistics,
)
from services.runtime.topic_partition import TP


def _part(broker: int, records: int, nbytes: int, state: str = "active") -> PartitionStats:
    return PartitionStats(
        100, 0, leader=broker, fetch_state=state, fetch_broker=broker,
        fetched_records=records, fetched_bytes=nbytes,
    )  # fmt: skip


def _stats(parts: dict[TP, PartitionStats], fetches: dict[int, int]) -> Statistics:
    brokers = {
        f"h:{9092 + node}/{node}": BrokerStats(f"h:{9092 + node}/{node}", node, "UP", sent, 0, 0)
        for node, sent in fetches.items()
    }
    brokers["h:9092/bootstrap"] = BrokerStats("h:9092/bootstrap", -1, "UP", 999, 0, 0)
    return Statistics(parts, brokers)


def test_statistics_give_each_partitions_fetch_broker_and_fetched_counts() -> None:
    document = json.dumps(
        {
            "topics": {
                "t": {
                    "partitions": {
                        "0": {"leader": 1, "broker": 3, "rxmsgs": 40, "rxbytes": 4000},
                        "1": {"leader": 2},
                    }
                }
            }
        }
    )
    parts = parse_statistics(document).partitions
    assert (parts[TP("t", 0)].leader, parts[TP("t", 0)].fetch_broker) == (1, 3)
    assert (parts[TP("t", 0)].fetched_records, parts[TP("t", 0)].fetched_bytes) == (40, 4000)
    assert (parts[TP("t", 1)].fetch_broker, parts[TP("t", 1)].fetched_bytes) == (-1, 0)


def test_a_window_divides_each_topics_fetched_deltas_by_the_fetch_requests_of_its_brokers() -> None:
    sizes = FetchSizes()
    a0, a1, b0 = TP("a", 0), TP("a", 1), TP("b", 0)
    first = sizes.add(
        _stats({a0: _part(1, 10, 1000), a1: _part(2, 0, 0), b0: _part(2, 5, 50)}, {1: 4, 2: 6})
    )
    # Counters seen first count from 0 (librdkafka starts them at 0 in this consumer).
    assert first.topics == (FetchWindow("a", 10, 10, 1000), FetchWindow("b", 6, 5, 50))
    assert first.total == FetchWindow(None, 10, 15, 1050)
    second = sizes.add(
        _stats({a0: _part(1, 30, 3000), a1: _part(2, 10, 500), b0: _part(2, 5, 50)}, {1: 8, 2: 16})
    )
    assert second.topics == (FetchWindow("a", 14, 30, 2500), FetchWindow("b", 10, 0, 0))
    assert second.topics[0].bytes_per_request == 2500 / 14
    assert second.topics[0].records_per_request == 30 / 14
    assert second.total == FetchWindow(None, 14, 30, 2500)


def test_partitions_not_fetched_and_windows_without_fetch_requests_give_nothing() -> None:
    sizes = FetchSizes()
    a0 = TP("a", 0)
    sizes.add(_stats({a0: _part(1, 10, 100)}, {1: 5}))
    idle = sizes.add(_stats({a0: _part(1, 10, 100, state="stopped")}, {1: 7}))
    assert idle.topics == ()  # released: no longer fetched, nothing arrived
    assert idle.total == FetchWindow(None, 2, 0, 0)
    none = sizes.add(_stats({a0: _part(1, 10, 100)}, {1: 7}))
    assert none == none.__class__(None, ())


def test_a_counter_that_went_back_started_again_from_zero() -> None:
    sizes = FetchSizes()
    a0 = TP("a", 0)
    sizes.add(_stats({a0: _part(1, 100, 10_000)}, {1: 50}))
    # A new consumer (live config change): its counters restart.
    again = sizes.add(_stats({a0: _part(1, 3, 300)}, {1: 2}))
    assert again.topics == (FetchWindow("a", 2, 3, 300),)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            wanted = s.name.startswith(("ds_sidecar_partition_", "ds_sidecar_fetch_"))
            if wanted and not s.name.endswith("_created") and "le" not in s.labels:
                out[(s.name, s.labels.get("topic", ""))] = s.value
    return out


def test_the_sidecar_exports_fetch_broker_leader_and_window_fetch_sizes() -> None:
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry, "g")
    table = PartitionTable(1 << 20, lambda: 0.0)
    a0 = TP("a", 0)
    table.add(Partition(a0, epoch=1, deadline=1e9, acks=PartitionAcks(0), ready=True, position=0))
    metrics.watch(table, lambda: 0.0, lambda: True)
    replica = PartitionStats(100, 0, leader=1, fetch_state="active", fetch_broker=3,
                             fetched_records=20, fetched_bytes=2000)  # fmt: skip
    metrics.statistics(_stats({a0: replica}, {3: 4}))
    scraped = _samples(registry)
    assert scraped[("ds_sidecar_partition_fetch_broker", "a")] == 3.0
    assert scraped[("ds_sidecar_partition_leader", "a")] == 1.0
    assert scraped[("ds_sidecar_fetch_size_bytes_count", "a")] == 1.0
    assert scraped[("ds_sidecar_fetch_size_bytes_sum", "a")] == 500.0
    assert scraped[("ds_sidecar_fetch_records_per_request_sum", "a")] == 5.0
    assert scraped[("ds_sidecar_fetch_size_all_bytes_sum", "")] == 500.0
