"""librdkafka statistics parsing and the per-lease rate/lag the sidecar reports."""

from __future__ import annotations

import json

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.partitions import TP, Partition
from services.consumer_sidecar.stats import PartitionStats, parse_partition_stats


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
