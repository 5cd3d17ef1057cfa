"""librdkafka statistics parsing and the per-lease rate/lag the sidecar reports."""

from __future__ import annotations

import json

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.partitions import Partition
from services.consumer_sidecar.stats import (
    PartitionStats,
    Statistics,
    Window,
    WindowTotals,
    parse_partition_stats,
    parse_statistics,
)
from services.runtime.topic_partition import TP


def test_parses_high_watermark_and_lag_and_skips_the_ua_partition() -> None:
    document = json.dumps(
        {
            "topics": {
                "t": {
                    "partitions": {
                        "0": {"hi_offset": 120, "consumer_lag": 20},
                        "1": {"hi_offset": -1, "consumer_lag": -1},
                        "-1": {"hi_offset": 0, "consumer_lag": 0},
                    }
                }
            }
        }
    )
    assert parse_partition_stats(document) == {
        TP("t", 0): PartitionStats(120, 20),
        TP("t", 1): PartitionStats(-1, -1),
    }


def test_garbage_gives_nothing() -> None:
    assert parse_partition_stats("not json") == {}
    assert parse_partition_stats("{}") == {}


def test_rate_is_bytes_per_second_since_the_last_report() -> None:
    part = Partition(TP("t", 0), epoch=1, deadline=10.0, acks=PartitionAcks(0))
    assert part.take_rate(1.0) == 0.0
    part.fetched_bytes += 5000
    assert part.take_rate(3.0) == 2500.0
    assert part.take_rate(4.0) == 0.0


def test_reported_lag_is_measured_from_the_committed_offset() -> None:
    part = Partition(TP("t", 0), epoch=1, deadline=10.0, acks=PartitionAcks(0))
    assert part.reported_lag() == -1
    part.high_watermark, part.committed = 150, 100
    assert part.reported_lag() == 50


# A consumer's statistics document as librdkafka 2.x emits it (fields per STATISTICS.md),
# trimmed to what the sidecar reads plus some it ignores.
STATS_DOCUMENT = {
    "name": "ds-sidecar-a#consumer-1",
    "type": "consumer",
    "rxmsgs": 3000,
    "brokers": {
        "127.0.0.1:9092/bootstrap": {
            "name": "127.0.0.1:9092/bootstrap",
            "nodeid": -1,
            "state": "UP",
            "rx": 2,
            "rxbytes": 400,
            "req": {"Metadata": 2},
            "rtt": {"cnt": 2, "sum": 3000, "max": 2000, "p50": 1000, "p99": 2000},
            "throttle": {"cnt": 0, "sum": 0, "max": 0, "p50": 0, "p99": 0},
        },
        "127.0.0.1:9092/1": {
            "name": "127.0.0.1:9092/1",
            "nodeid": 1,
            "state": "UP",
            "tx": 130,
            "txbytes": 9100,
            "connects": 2,
            "disconnects": 1,
            "rx": 128,
            "rxbytes": 524288,
            "req": {"Fetch": 120, "OffsetCommit": 5, "ListOffsets": 3},
            "rtt": {"cnt": 10, "sum": 1_000_000, "max": 250_000, "avg": 100_000,
                    "p50": 101_000, "p99": 249_000},
            "throttle": {"cnt": 10, "sum": 30, "max": 20, "avg": 3, "p50": 0, "p99": 20},
            "toppars": {"t-0": {"topic": "t", "partition": 0}},
        },
    },
    "topics": {
        "t": {
            "partitions": {
                "0": {"hi_offset": 500, "lo_offset": 100, "consumer_lag": 7, "fetchq_cnt": 42,
                      "app_offset": 493, "committed_offset": 480},
                "1": {"hi_offset": -1001, "lo_offset": -1001, "consumer_lag": -1},
                "-1": {"hi_offset": -1001, "consumer_lag": -1},
            }
        }
    },
}  # fmt: skip


def test_parses_partitions_and_brokers_of_a_consumer_document() -> None:
    stats = parse_statistics(json.dumps(STATS_DOCUMENT))
    assert stats.partitions == {
        TP("t", 0): PartitionStats(500, 7, log_start=100, fetch_queue_records=42),
        TP("t", 1): PartitionStats(-1, -1, log_start=-1),
    }
    broker = stats.brokers["127.0.0.1:9092/1"]
    assert (broker.node_id, broker.state, broker.fetch_requests) == (1, "UP", 120)
    assert (broker.responses, broker.received_bytes) == (128, 524288)
    assert (broker.requests, broker.sent_bytes) == (130, 9100)
    assert (broker.connects, broker.disconnects) == (2, 1)
    assert broker.rtt_us == Window(count=10, total=1_000_000, max=250_000, p50=101_000, p99=249_000)
    assert broker.throttle_ms == Window(count=10, total=30, max=20, p50=0, p99=20)
    bootstrap = stats.brokers["127.0.0.1:9092/bootstrap"]
    assert (bootstrap.node_id, bootstrap.fetch_requests) == (-1, 0)


def test_windows_reset_at_each_emit_are_summed_into_cumulative_totals() -> None:
    totals = WindowTotals()
    first = parse_statistics(json.dumps(STATS_DOCUMENT)).brokers
    totals.add(first)
    totals.add(first)
    rtt = totals.rtt["127.0.0.1:9092/1"]
    assert (rtt.count, rtt.total, rtt.last.max) == (20, 2_000_000, 250_000)
    assert totals.throttle["127.0.0.1:9092/1"].total == 60


def test_malformed_parts_are_skipped_not_raised() -> None:
    document = {"brokers": {"b": "nonsense"}, "topics": {"t": {"partitions": {"x": {}, "2": 5}}}}
    assert parse_statistics(json.dumps(document)) == Statistics({}, {})
    assert parse_statistics("[1, 2]") == Statistics({}, {})
