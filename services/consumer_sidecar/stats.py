"""librdkafka statistics → per-partition high watermark and lag (pure parsing).

librdkafka emits a JSON document every ``statistics.interval.ms`` from inside
``consume()`` (ARCHITECTURE §10). Per partition it has ``hi_offset`` (high watermark),
``ls_offset`` (last stable offset) and ``consumer_lag``; -1 means unknown. Partitions
-1 (the topic's internal "UA" bucket) are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.consumer_sidecar.partitions import TP


@dataclass(frozen=True)
class PartitionStats:
    high_watermark: int
    lag: int  # records between the consumer's position and the end; -1 = unknown


def parse_partition_stats(document: str) -> dict[TP, PartitionStats]:
    try:
        stats: dict[str, Any] = json.loads(document)
    except ValueError:
        return {}
    out: dict[TP, PartitionStats] = {}
    for topic, tstats in (stats.get("topics") or {}).items():
        for pid, pstats in (tstats.get("partitions") or {}).items():
            try:
                partition = int(pid)
            except ValueError:
                continue
            if partition < 0:
                continue
            out[TP(topic, partition)] = PartitionStats(
                high_watermark=int(pstats.get("hi_offset", -1)),
                lag=int(pstats.get("consumer_lag", -1)),
            )
    return out
