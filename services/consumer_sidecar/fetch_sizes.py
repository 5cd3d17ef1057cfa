"""Fetch sizes per topic, from librdkafka's statistics (pure: no I/O, no clock, no threads).

librdkafka decodes Fetch responses inside its broker threads and reports no size per
response (STATISTICS.md has no such window). What it does report, cumulatively: per
partition ``rxmsgs`` and ``rxbytes`` (records and bytes fetched) and ``broker`` (the node
it is fetched from), per broker ``req.Fetch`` (Fetch requests sent). Between two
statistics documents (one *window*, ``statistics.interval.ms``) a topic's figures are
therefore:

* **bytes per Fetch request**: the bytes fetched of its partitions over the window,
  divided by the Fetch requests sent meanwhile to the brokers its partitions are fetched
  from (one Fetch request to a broker carries every partition fetched from it, so each
  request counts once for each topic fetched from that broker, as the Java consumer
  counts a response once per topic in it);
* **records per Fetch request**: the same with the records fetched.

Both are means over the window (empty long-poll responses included: they are Fetch
requests too), not sizes of single responses. The fetch manager's figure over every
topic is the same sum over all partitions and all brokers' Fetch requests.

A counter lower than in the previous document, or a partition or broker seen for the
first time, counts from 0: librdkafka starts each partition's and broker's counters at 0
when it creates them, inside this consumer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from services.consumer_sidecar.fetch_gaps import FETCH_ACTIVE
from services.consumer_sidecar.stats import PartitionStats, Statistics
from services.runtime.topic_partition import TP


@dataclass(frozen=True)
class FetchWindow:
    """What one statistics window fetched (of one topic, or of all: ``topic`` None)."""

    topic: str | None
    requests: int  # Fetch requests sent to the brokers the partitions are fetched from
    records: int
    nbytes: int

    @property
    def bytes_per_request(self) -> float:
        return self.nbytes / self.requests

    @property
    def records_per_request(self) -> float:
        return self.records / self.requests


@dataclass(frozen=True)
class FetchWindows:
    """One window's figures: over all topics (None when no Fetch request was sent) and
    per topic fetched in it."""

    total: FetchWindow | None
    topics: tuple[FetchWindow, ...]


def _delta(now: int, before: int | None) -> int:
    return now if before is None or now < before else now - before


class FetchSizes:
    """Feeds on each statistics document; returns the window since the previous one.
    Not thread-safe: fed by the one statistics callback."""

    def __init__(self) -> None:
        self._partitions: dict[TP, tuple[int | None, int | None]] = {}  # (rxmsgs, rxbytes)
        self._brokers: dict[int, int] = {}  # node id -> req.Fetch

    def add(self, stats: Statistics) -> FetchWindows:
        requests = self._broker_requests(stats)
        records: dict[str, int] = defaultdict(int)
        nbytes: dict[str, int] = defaultdict(int)
        brokers: dict[str, set[int]] = defaultdict(set)
        seen: dict[TP, tuple[int | None, int | None]] = {}
        for tp, part in stats.partitions.items():
            before_records, before_bytes = self._partitions.get(tp, (None, None))
            seen[tp] = (part.fetched_records, part.fetched_bytes)
            got = _delta(part.fetched_records, before_records)
            size = _delta(part.fetched_bytes, before_bytes)
            if not _fetched(part, got):
                continue
            records[tp.topic] += got
            nbytes[tp.topic] += size
            if part.fetch_broker >= 0:
                brokers[tp.topic].add(part.fetch_broker)
        self._partitions = seen
        topics = []
        for topic in sorted(records):
            sent = sum(requests.get(node, 0) for node in brokers[topic])
            if sent > 0:
                topics.append(FetchWindow(topic, sent, records[topic], nbytes[topic]))
        all_sent = sum(requests.values())
        total = (
            FetchWindow(None, all_sent, sum(records.values()), sum(nbytes.values()))
            if all_sent > 0
            else None
        )
        return FetchWindows(total, tuple(topics))

    def _broker_requests(self, stats: Statistics) -> Mapping[int, int]:
        """Fetch requests per broker node over the window (bootstrap entries, node -1,
        are the same brokers under the address they were first reached at: skipped)."""
        now: dict[int, int] = defaultdict(int)
        for broker in stats.brokers.values():
            if broker.node_id >= 0:
                now[broker.node_id] += broker.fetch_requests
        sent = {node: _delta(count, self._brokers.get(node)) for node, count in now.items()}
        self._brokers = dict(now)
        return sent


def _fetched(part: PartitionStats, records: int) -> bool:
    """Whether the partition was fetched in the window: librdkafka fetches it now, or
    records of it arrived meanwhile."""
    return part.fetch_state == FETCH_ACTIVE or records > 0
