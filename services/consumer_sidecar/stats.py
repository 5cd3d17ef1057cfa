"""librdkafka statistics → what the sidecar needs and exports (pure parsing, no I/O).

librdkafka emits a JSON document every ``statistics.interval.ms`` from inside
``consume()`` (ARCHITECTURE §10; field reference: librdkafka's STATISTICS.md).

* Per partition (``topics.<t>.partitions.<p>``): ``hi_offset`` (high watermark),
  ``lo_offset`` (log start offset), ``consumer_lag`` (hi_offset - max(app_offset,
  committed_offset)), ``fetchq_cnt``/``fetchq_size`` (librdkafka's prefetch queue),
  ``leader`` (the leading broker's id, -1 unknown), ``broker`` (the broker librdkafka
  fetches it from: the leader, or a preferred read replica the leader named), ``rxmsgs``
  and ``rxbytes`` (records and bytes fetched, cumulative; the fetch sizes,
  :mod:`~services.consumer_sidecar.fetch_sizes`) and ``fetch_state`` (``active`` while
  librdkafka fetches it; the not-fetching gaps, :mod:`~services.consumer_sidecar.fetch_gaps`). An
  offset librdkafka does not know is -1 or -1001 (``RD_KAFKA_OFFSET_INVALID``); both
  become -1 here. Partition -1 (the topic's internal "UA" bucket) is skipped.
* Per broker (``brokers.<name>``): ``req.Fetch`` (Fetch requests sent, cumulative), ``rx``
  and ``rxbytes`` (responses and bytes received, cumulative), ``tx`` and ``txbytes``
  (requests and bytes sent, cumulative), ``connects`` and ``disconnects`` (connections
  made and lost, cumulative), ``state`` (``UP`` while connected), and two *window* stats that
  librdkafka resets at every emit: ``rtt`` (request round trip, microseconds) and
  ``throttle`` (broker throttle time, milliseconds). :class:`WindowTotals` adds the windows
  up so they can be exported as cumulative ``_count``/``_sum`` series.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.runtime.topic_partition import TP

UNKNOWN = -1


@dataclass(frozen=True)
class PartitionStats:
    high_watermark: int
    lag: int  # records between the consumer's position and the end; -1 = unknown
    log_start: int = UNKNOWN  # lo_offset: the partition's first offset on the broker
    fetch_queue_records: int = 0  # fetchq_cnt: prefetched, not yet returned by consume()
    leader: int = UNKNOWN  # the leading broker's node id
    fetch_state: str = ""  # librdkafka's: none, offset-query, offset-wait, active, ...
    fetch_broker: int = UNKNOWN  # broker: the node it is fetched from (leader or replica)
    fetched_records: int = 0  # rxmsgs: records fetched, cumulative
    fetched_bytes: int = 0  # rxbytes: bytes of those records, cumulative


@dataclass(frozen=True)
class Window:
    """One librdkafka rolling window (values in the unit librdkafka uses for it)."""

    count: int = 0
    total: int = 0
    max: int = 0
    p50: int = 0
    p99: int = 0


@dataclass(frozen=True)
class BrokerStats:
    name: str  # librdkafka's "host:port/nodeid"
    node_id: int  # -1 for a bootstrap entry
    state: str
    fetch_requests: int  # req.Fetch, cumulative
    responses: int  # rx, cumulative
    received_bytes: int  # rxbytes, cumulative
    rtt_us: Window = field(default_factory=Window)
    requests: int = 0  # tx: requests sent, cumulative
    sent_bytes: int = 0  # txbytes, cumulative
    connects: int = 0  # connection attempts that succeeded, cumulative
    disconnects: int = 0  # connections lost or closed, cumulative
    throttle_ms: Window = field(default_factory=Window)
    # librdkafka's "source": configured (bootstrap.servers), learned (from metadata),
    # internal (its placeholder, ``:0/internal``) or logical (``GroupCoordinator``, which
    # stands for whichever broker coordinates the group); "" when not reported.
    source: str = ""


# The entries of a client that can reach the cluster: brokers it was given or learned.
REAL_BROKER_SOURCES = ("configured", "learned")


@dataclass(frozen=True)
class Statistics:
    partitions: dict[TP, PartitionStats]
    brokers: dict[str, BrokerStats]


def _offset(value: Any) -> int:
    """An offset field: librdkafka's -1001 (invalid) and any negative value → -1."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return UNKNOWN
    return number if number >= 0 else UNKNOWN


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _window(raw: Any) -> Window:
    if not isinstance(raw, Mapping):
        return Window()
    return Window(
        count=_int(raw.get("cnt")),
        total=_int(raw.get("sum")),
        max=_int(raw.get("max")),
        p50=_int(raw.get("p50")),
        p99=_int(raw.get("p99")),
    )


def _partitions(stats: Mapping[str, Any]) -> dict[TP, PartitionStats]:
    out: dict[TP, PartitionStats] = {}
    topics = stats.get("topics")
    for topic, tstats in (topics if isinstance(topics, Mapping) else {}).items():
        partitions = tstats.get("partitions") if isinstance(tstats, Mapping) else None
        for pid, pstats in (partitions if isinstance(partitions, Mapping) else {}).items():
            try:
                partition = int(pid)
            except ValueError:
                continue
            if partition < 0 or not isinstance(pstats, Mapping):
                continue
            lag = _int(pstats.get("consumer_lag", UNKNOWN))
            out[TP(topic, partition)] = PartitionStats(
                high_watermark=_offset(pstats.get("hi_offset")),
                lag=lag if lag >= 0 else UNKNOWN,
                log_start=_offset(pstats.get("lo_offset")),
                fetch_queue_records=max(0, _int(pstats.get("fetchq_cnt"))),
                leader=_offset(pstats.get("leader")),
                fetch_state=str(pstats.get("fetch_state", "")),
                fetch_broker=_offset(pstats.get("broker")),
                fetched_records=max(0, _int(pstats.get("rxmsgs"))),
                fetched_bytes=max(0, _int(pstats.get("rxbytes"))),
            )
    return out


def _brokers(stats: Mapping[str, Any]) -> dict[str, BrokerStats]:
    out: dict[str, BrokerStats] = {}
    brokers = stats.get("brokers")
    for name, bstats in (brokers if isinstance(brokers, Mapping) else {}).items():
        if not isinstance(bstats, Mapping):
            continue
        requests = bstats.get("req")
        out[str(name)] = BrokerStats(
            name=str(name),
            node_id=_int(bstats.get("nodeid", -1)),
            state=str(bstats.get("state", "")),
            fetch_requests=_int(requests.get("Fetch")) if isinstance(requests, Mapping) else 0,
            responses=_int(bstats.get("rx")),
            received_bytes=_int(bstats.get("rxbytes")),
            rtt_us=_window(bstats.get("rtt")),
            throttle_ms=_window(bstats.get("throttle")),
            requests=_int(bstats.get("tx")),
            sent_bytes=_int(bstats.get("txbytes")),
            connects=_int(bstats.get("connects")),
            disconnects=_int(bstats.get("disconnects")),
            source=str(bstats.get("source", "")),
        )
    return out


def knows_a_broker(stats: Statistics) -> bool:
    """Whether the client lists any broker it could connect to (in any state, down ones
    included). False when librdkafka forgot every broker and lists only its logical and
    internal entries: a client that then connects nowhere until it is made anew
    (broker_loss.py).
    Empty statistics (none yet, or unreadable) say nothing: True."""
    if not stats.brokers:
        return True
    return any(
        b.source in REAL_BROKER_SOURCES
        or (not b.source and b.node_id >= 0)
        or (not b.source and b.name.endswith("/bootstrap"))
        for b in stats.brokers.values()
    )


def parse_statistics(document: str) -> Statistics:
    """The whole document; an unreadable one gives empty statistics."""
    try:
        stats = json.loads(document)
    except ValueError:
        return Statistics({}, {})
    if not isinstance(stats, Mapping):
        return Statistics({}, {})
    return Statistics(_partitions(stats), _brokers(stats))


def parse_partition_stats(document: str) -> dict[TP, PartitionStats]:
    return parse_statistics(document).partitions


@dataclass
class WindowSums:
    """Cumulative count and sum of one window stat over every emit so far."""

    count: int = 0
    total: int = 0
    last: Window = field(default_factory=Window)

    def add(self, window: Window) -> None:
        self.count += window.count
        self.total += window.total
        self.last = window


@dataclass
class WindowTotals:
    """librdkafka's windows, reset at every emit, made cumulative per broker (what a
    Prometheus summary's ``_count``/``_sum`` must be). Not thread-safe: fed by the one
    statistics callback; readers take :meth:`snapshot`."""

    rtt: dict[str, WindowSums] = field(default_factory=dict)
    throttle: dict[str, WindowSums] = field(default_factory=dict)

    def add(self, brokers: Mapping[str, BrokerStats]) -> None:
        for name, broker in brokers.items():
            self.rtt.setdefault(name, WindowSums()).add(broker.rtt_us)
            self.throttle.setdefault(name, WindowSums()).add(broker.throttle_ms)
