"""The sidecar's consumer metrics, declared against the app's registry (ARCHITECTURE §5.3).

Three kinds of sources, one place:

* **Scrape-time views** (:class:`SidecarCollector`): lag, lead, buffers, assigned partitions,
  last poll age, assigner connection, computed from the partition table and the latest
  librdkafka statistics when Prometheus scrapes, so a revoked partition's series vanish
  with it and the hot path pays nothing.
* **librdkafka statistics** (``stats_cb``, :mod:`services.consumer_sidecar.stats`): Fetch
  requests, responses and bytes per broker, broker round trip and throttle time, the broker
  each partition is fetched from, and bytes and records per Fetch request per topic over
  each statistics window (:mod:`services.consumer_sidecar.fetch_sizes`).
* **The sidecar's own timing and counts**: records and bytes consumed (per consume()
  batch, per partition run — never per record), polls, commits, lease changes, session
  heartbeats, joins / syncs / lost partitions (the session's in leased mode, Kafka's
  rebalance callbacks' in kafka_group mode), and the client-access metrics per ``client_id``
  (:mod:`services.consumer_sidecar.client_access`).

Every exported name, its type, labels and help come from
:data:`~services.consumer_sidecar.metric_table.METRIC_TABLE`.

One job, why whole (about 660 lines): turning the sidecar's hot-path events into its
Prometheus metrics. The names and help come from metric_table.py; what stays here are the
recording methods (on label children bound once, which keeps recording cheap) and the one
collector that reads librdkafka's statistics; they share the group's metric objects.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.consumer_sidecar.client_access import ClientIdLimiter, ClientMetrics
from services.consumer_sidecar.fetch_gaps import GapTracker, HandoffGaps, wants_records
from services.consumer_sidecar.fetch_sizes import FetchSizes, FetchWindows
from services.consumer_sidecar.metric_table import (
    GAP_BUCKETS,
    LATENCY_BUCKETS,
    LEASE_KINDS,
    POLL_BUCKETS,
    RECORD_COUNT_BUCKETS,
    REQUEST_BUCKETS,
    SIZE_BUCKETS,
    SPECS,
    base_name,
    help_of,
)
from services.consumer_sidecar.stats import Statistics, WindowSums, WindowTotals
from services.runtime.topic_partition import TP

if TYPE_CHECKING:
    from services.consumer_sidecar.partitions import PartitionTable


# Why records come due again (Redeliverer.after_due), the label of ds_sidecar_redeliveries_total.
REDELIVERY_REASONS = ("visibility_timeout", "nack", "stream_end", "not_sent")


# ---- sidecar consumer metrics -------------------------------------------------------------


class PollTimer:
    """The fetch loop's polls: time between them, time waiting inside consume()."""

    def __init__(self, interval: Histogram, wait: Counter) -> None:
        self._interval = interval
        self._wait = wait
        self._previous: float | None = None

    def polled(self, started: float, returned: float) -> None:
        if self._previous is not None:
            self._interval.observe(started - self._previous)
        self._previous = started
        self._wait.inc(returned - started)


@dataclass
class _StatsView:
    latest: Statistics = field(default_factory=lambda: Statistics({}, {}))
    totals: WindowTotals = field(default_factory=WindowTotals)
    received_at: float = 0.0  # monotonic time the latest statistics arrived


# How often the fetch loop looks at the held partitions for the not-fetching gaps: well
# under GAP_FLOOR_SECONDS, and a dozen dict lookups per partition at most 4 times a second.
GAP_LOOK_SECONDS = 0.25


def _wall_minus_monotonic() -> float:
    return time.time() - time.monotonic()


class NotFetching:
    """``ds_partition_not_fetching_seconds`` and its ``_current_`` gauge: the gaps
    (:mod:`~services.consumer_sidecar.fetch_gaps`) of the held partitions, and
    ``ds_sidecar_handoff_gap_seconds``, the gaps from a grant to the first records. Fed on
    the fetch thread (records fetched; a look every :data:`GAP_LOOK_SECONDS` at the
    partition table and the latest statistics), read at scrape time; one lock between the
    two. ``wall_offset`` turns a monotonic grant time into wall time (record timestamps)."""

    def __init__(
        self,
        group: str,
        table: PartitionTable,
        statistics: Callable[[], tuple[Statistics, float]],
        histogram: Histogram,
        handoffs: Histogram | None = None,
        wall_offset: Callable[[], float] = _wall_minus_monotonic,
    ) -> None:
        self.group = group
        self._table = table
        self._statistics = statistics
        self._histogram = histogram
        self._handoff_histogram = handoffs
        self._wall_offset = wall_offset
        self._tracker: GapTracker[TP] = GapTracker()
        self._handoffs: HandoffGaps[TP] = HandoffGaps()
        self._lock = threading.Lock()
        self._look_at = 0.0

    def fetched(self, tp: TP, at: float, first_timestamp_ms: int = -1) -> None:
        """Fetch thread: records of ``tp`` came out of consume() at ``at``, the first of
        them written at ``first_timestamp_ms`` (-1: no timestamp)."""
        part = self._table.get(tp)
        handoff = None
        with self._lock:
            gap = self._tracker.fetched(tp, at)
            if part is not None and not part.revoking:  # records of a released lease: none
                waited = first_timestamp_ms < 0 or (
                    first_timestamp_ms / 1000 <= part.granted_at + self._wall_offset()
                )
                handoff = self._handoffs.fetched(tp, at, part.granted_at, waited)
        if gap is not None:
            self._observe(tp, gap)
        if handoff is not None and self._handoff_histogram is not None:
            self._handoff_histogram.labels(self.group, tp.topic, str(tp.partition)).observe(handoff)

    def tick(self, now: float) -> None:
        """Fetch thread, every loop: look at the held partitions (rate-limited)."""
        if now < self._look_at:
            return
        self._look_at = now + GAP_LOOK_SECONDS
        stats, stats_at = self._statistics()
        brokers = {b.node_id: b.state for b in stats.brokers.values() if b.node_id >= 0}
        holding = self._table.holding
        held = [p for p in self._table.snapshot() if not p.revoking]
        ended: list[tuple[TP, float]] = []
        with self._lock:
            ended += self._tracker.held((p.tp for p in held), now)
            self._handoffs.held((p.tp, p.granted_at) for p in held)
            for part in held:
                pstats = stats.partitions.get(part.tp)
                if part.paused or part.suspended_at is not None or holding:
                    # Not fetching by design (backpressure, a suspended lease): not a gap.
                    gap = self._tracker.look(part.tp, now, wanting=False)
                    self._handoffs.idle(part.tp, now)
                elif not part.ready or pstats is None or part.position < 0:
                    # Granted, fetching being set up, or no statistics of it yet: the stretch
                    # runs on from the grant, a gap if the statistics then show it behind.
                    continue
                else:
                    wanting = wants_records(
                        position=part.position,
                        high_watermark=pstats.high_watermark,
                        leader=pstats.leader,
                        leader_state=brokers.get(pstats.leader),
                        fetch_state=pstats.fetch_state,
                    )
                    gap = self._tracker.look(part.tp, stats_at, wanting)
                    if not wanting:
                        self._handoffs.idle(part.tp, stats_at)
                if gap is not None:
                    ended.append((part.tp, gap))
        for tp, gap in ended:
            self._observe(tp, gap)

    def current(self, tp: TP, now: float) -> float:
        with self._lock:
            return self._tracker.current(tp, now)

    def _observe(self, tp: TP, gap: float) -> None:
        self._histogram.labels(self.group, tp.topic, str(tp.partition)).observe(gap)


class SidecarCollector(Collector):
    """Scrape-time gauges from the partition table and the latest statistics."""

    def __init__(
        self,
        group: str,
        table: PartitionTable,
        last_poll: Callable[[], float],
        connected: Callable[[], bool],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self.table = table
        self._last_poll = last_poll
        self._connected = connected
        self._monotonic = monotonic
        self._stats = _StatsView()
        self._lock = threading.Lock()
        self.gaps: NotFetching | None = None  # with metrics enabled (SidecarMetrics.watch)

    def apply_statistics(self, stats: Statistics) -> None:
        """Fetch thread (stats_cb)."""
        with self._lock:
            self._stats.latest = stats
            self._stats.totals.add(stats.brokers)
            self._stats.received_at = self._monotonic()

    def statistics(self) -> tuple[Statistics, float]:
        """The latest statistics and when they arrived (monotonic; 0.0 = none yet)."""
        with self._lock:
            return self._stats.latest, self._stats.received_at

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._partition_metrics()
        yield from self._broker_metrics()
        group = [self.group]
        yield _gauge("ds_sidecar_buffer_bytes", group, self.table.buffered_bytes)
        yield _gauge("ds_sidecar_buffer_limit_bytes", group, self.table.buffer_max_bytes)
        age = max(0.0, self._monotonic() - self._last_poll())
        yield _gauge("ds_sidecar_last_poll_age_seconds", group, age)
        yield _gauge("ds_sidecar_assigner_connected", group, 1.0 if self._connected() else 0.0)

    def _partition_metrics(self) -> Iterator[Metric]:
        with self._lock:
            stats = self._stats.latest.partitions
        names: tuple[str, ...] = (
            "ds_sidecar_records_lag",
            "ds_sidecar_records_lead",
            "ds_sidecar_buffered_records",
            "ds_sidecar_inflight_records",
            "ds_sidecar_due_records",
        )
        names += ("ds_sidecar_partition_fetch_broker", "ds_sidecar_partition_leader")
        names += ("ds_partition_not_fetching_current_seconds",) if self.gaps is not None else ()
        families = {
            name: GaugeMetricFamily(name, help_of(name), labels=["group", "topic", "partition"])
            for name in names
        }
        now = self._monotonic()
        lags: list[int] = []
        leads: list[int] = []
        held = 0
        for part in sorted(self.table.snapshot(), key=lambda p: p.tp):
            if part.revoking:
                continue
            held += 1
            labels = [self.group, part.tp.topic, str(part.tp.partition)]
            families["ds_sidecar_buffered_records"].add_metric(labels, part.buffered_records)
            families["ds_sidecar_inflight_records"].add_metric(labels, part.acks.inflight)
            families["ds_sidecar_due_records"].add_metric(labels, part.acks.due)
            if self.gaps is not None:
                families["ds_partition_not_fetching_current_seconds"].add_metric(
                    labels, self.gaps.current(part.tp, now)
                )
            pstats = stats.get(part.tp)
            if pstats is not None:
                families["ds_sidecar_partition_fetch_broker"].add_metric(
                    labels, pstats.fetch_broker
                )
                families["ds_sidecar_partition_leader"].add_metric(labels, pstats.leader)
            if part.position < 0:
                continue  # fetching not set up yet
            if part.high_watermark >= 0:
                lag = max(0, part.high_watermark - part.position)
                lags.append(lag)
                families["ds_sidecar_records_lag"].add_metric(labels, lag)
            if pstats is not None and pstats.log_start >= 0:
                lead = max(0, part.position - pstats.log_start)
                leads.append(lead)
                families["ds_sidecar_records_lead"].add_metric(labels, lead)
        yield from families.values()
        group = [self.group]
        yield _gauge("ds_sidecar_assigned_partitions", group, held)
        if lags:
            yield _gauge("ds_sidecar_records_lag_max", group, max(lags))
        if leads:
            yield _gauge("ds_sidecar_records_lead_min", group, min(leads))

    def _broker_metrics(self) -> Iterator[Metric]:
        with self._lock:
            brokers = dict(self._stats.latest.brokers)
            rtt = dict(self._stats.totals.rtt)
            throttle = dict(self._stats.totals.throttle)
        labels = ["group", "broker"]
        counters = {
            name: CounterMetricFamily(base_name(name), help_of(name), labels=labels)
            for name in (
                "ds_sidecar_fetch_requests_total",
                "ds_sidecar_broker_responses_total",
                "ds_sidecar_broker_received_bytes_total",
                "ds_sidecar_broker_requests_total",
                "ds_sidecar_broker_sent_bytes_total",
                "ds_sidecar_broker_connects_total",
                "ds_sidecar_broker_disconnects_total",
            )
        }
        connected = GaugeMetricFamily(
            "ds_sidecar_broker_connected", help_of("ds_sidecar_broker_connected"), labels=labels
        )
        maxima = {
            name: GaugeMetricFamily(name, help_of(name), labels=labels)
            for name in (
                "ds_sidecar_broker_rtt_max_seconds",
                "ds_sidecar_broker_throttle_max_seconds",
            )
        }
        rtt_summary = Metric(
            "ds_sidecar_broker_rtt_seconds", help_of("ds_sidecar_broker_rtt_seconds"), "summary"
        )
        throttle_summary = Metric(
            "ds_sidecar_broker_throttle_seconds",
            help_of("ds_sidecar_broker_throttle_seconds"),
            "summary",
        )
        for name, broker in sorted(brokers.items()):
            if broker.node_id < 0:
                continue  # a bootstrap entry: the same broker under its learned name
            values = [self.group, name]
            counters["ds_sidecar_fetch_requests_total"].add_metric(values, broker.fetch_requests)
            counters["ds_sidecar_broker_responses_total"].add_metric(values, broker.responses)
            counters["ds_sidecar_broker_received_bytes_total"].add_metric(
                values, broker.received_bytes
            )
            counters["ds_sidecar_broker_requests_total"].add_metric(values, broker.requests)
            counters["ds_sidecar_broker_sent_bytes_total"].add_metric(values, broker.sent_bytes)
            counters["ds_sidecar_broker_connects_total"].add_metric(values, broker.connects)
            counters["ds_sidecar_broker_disconnects_total"].add_metric(values, broker.disconnects)
            connected.add_metric(values, 1.0 if broker.state == "UP" else 0.0)
            maxima["ds_sidecar_broker_rtt_max_seconds"].add_metric(values, broker.rtt_us.max / 1e6)
            maxima["ds_sidecar_broker_throttle_max_seconds"].add_metric(
                values, broker.throttle_ms.max / 1e3
            )
            _summary(rtt_summary, self.group, name, rtt.get(name), 1e6)
            _summary(throttle_summary, self.group, name, throttle.get(name), 1e3)
        yield from counters.values()
        yield connected
        yield from maxima.values()
        yield rtt_summary
        yield throttle_summary


def _table_histogram(name: str, buckets: Sequence[float], registry: CollectorRegistry) -> Histogram:
    """A histogram of the metric table: its help and labels from ``METRIC_TABLE``."""
    return Histogram(
        name, help_of(name), list(SPECS[name].labels), buckets=buckets, registry=registry
    )


def _gauge(name: str, labels: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_of(name), labels=list(SPECS[name].labels))
    family.add_metric(labels, value)
    return family


def _summary(
    family: Metric, group: str, broker: str, sums: WindowSums | None, per_second: float
) -> None:
    if sums is None:
        return
    labels = {"group": group, "broker": broker}
    for quantile, value in (("0.5", sums.last.p50), ("0.99", sums.last.p99)):
        family.add_sample(family.name, {**labels, "quantile": quantile}, value / per_second)
    family.add_sample(family.name + "_count", labels, float(sums.count))
    family.add_sample(family.name + "_sum", labels, sums.total / per_second)


class SidecarMetrics:
    """All of the sidecar's metrics; hooks for the fetch loop, lease keeper and session.

    With ``enabled`` False (``DS_METRICS_ENABLED=false``) the per-batch and per-call hooks
    are not installed (the benchmark's baseline); scrape-time views stay."""

    def __init__(
        self,
        registry: CollectorRegistry,
        group: str,
        *,
        enabled: bool = True,
        max_client_ids: int = 100,
        client_idle_seconds: float = 600.0,
    ) -> None:
        self.group = group
        self.enabled = enabled
        self.kafka_errors = Counter(
            base_name("ds_sidecar_kafka_errors_total"),
            help_of("ds_sidecar_kafka_errors_total"),
            ["kind", "code"],
            registry=registry,
        )
        self._consumed_records = Counter(
            base_name("ds_sidecar_records_consumed_total"),
            help_of("ds_sidecar_records_consumed_total"),
            ["group", "topic"],
            registry=registry,
        )
        self._consumed_bytes = Counter(
            base_name("ds_sidecar_bytes_consumed_total"),
            help_of("ds_sidecar_bytes_consumed_total"),
            ["group", "topic"],
            registry=registry,
        )
        self._per_topic: dict[str, tuple[Any, Any]] = {}
        commits = Counter(
            base_name("ds_sidecar_commits_total"),
            help_of("ds_sidecar_commits_total"),
            ["group", "result"],
            registry=registry,
        )
        self._commit_ok = commits.labels(group, "ok")
        self._commit_error = commits.labels(group, "error")
        self._commit_latency = Histogram(
            "ds_sidecar_commit_latency_seconds",
            help_of("ds_sidecar_commit_latency_seconds"),
            ["group"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(group)
        changes = Counter(
            base_name("ds_sidecar_lease_changes_total"),
            help_of("ds_sidecar_lease_changes_total"),
            ["group", "kind"],
            registry=registry,
        )
        self._lease_changes = {kind: changes.labels(group, kind) for kind in LEASE_KINDS}
        latency = Histogram(
            "ds_sidecar_lease_change_latency_seconds",
            help_of("ds_sidecar_lease_change_latency_seconds"),
            ["group", "kind"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self._lease_latency = {kind: latency.labels(group, kind) for kind in ("grant", "revoke")}
        self._last_lease_change = Gauge(
            "ds_sidecar_last_lease_change_timestamp_seconds",
            help_of("ds_sidecar_last_lease_change_timestamp_seconds"),
            ["group"],
            registry=registry,
        ).labels(group)
        self.polls = PollTimer(
            Histogram(
                "ds_sidecar_poll_interval_seconds",
                help_of("ds_sidecar_poll_interval_seconds"),
                ["group"],
                buckets=POLL_BUCKETS,
                registry=registry,
            ).labels(group),
            Counter(
                base_name("ds_sidecar_poll_wait_seconds_total"),
                help_of("ds_sidecar_poll_wait_seconds_total"),
                ["group"],
                registry=registry,
            ).labels(group),
        )
        self._heartbeats = Counter(
            base_name("ds_sidecar_heartbeats_total"),
            help_of("ds_sidecar_heartbeats_total"),
            ["group"],
            registry=registry,
        ).labels(group)
        self._heartbeat_rtt = Histogram(
            "ds_sidecar_heartbeat_response_seconds",
            help_of("ds_sidecar_heartbeat_response_seconds"),
            ["group"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(group)
        joins = Counter(
            base_name("ds_sidecar_joins_total"),
            help_of("ds_sidecar_joins_total"),
            ["group", "result"],
            registry=registry,
        )
        self._joins = {True: joins.labels(group, "ok"), False: joins.labels(group, "error")}
        self._join_seconds, self._sync_seconds, self._lost_seconds = (
            Histogram(
                name, help_of(name), ["group"], buckets=REQUEST_BUCKETS, registry=registry
            ).labels(group)
            for name in (
                "ds_sidecar_join_seconds",
                "ds_sidecar_sync_seconds",
                "ds_sidecar_partitions_lost_seconds",
            )
        )
        self._last_heartbeat = Gauge(
            "ds_sidecar_last_heartbeat_timestamp_seconds",
            help_of("ds_sidecar_last_heartbeat_timestamp_seconds"),
            ["group"],
            registry=registry,
        ).labels(group)
        self._redeliveries = Counter(
            base_name("ds_sidecar_redeliveries_total"),
            help_of("ds_sidecar_redeliveries_total"),
            ["group", "reason"],
            registry=registry,
        )
        for reason in REDELIVERY_REASONS:  # a known set: each series exists from 0
            self._redeliveries.labels(group, reason)
        self._given_up = Counter(
            base_name("ds_sidecar_records_given_up_total"),
            help_of("ds_sidecar_records_given_up_total"),
            ["group"],
            registry=registry,
        ).labels(group)
        self._dead_lettered = Counter(
            base_name("ds_sidecar_records_dead_lettered_total"),
            help_of("ds_sidecar_records_dead_lettered_total"),
            ["group"],
            registry=registry,
        ).labels(group)
        self._dlq_records = Gauge(
            base_name("ds_sidecar_dead_letter_records"),
            help_of("ds_sidecar_dead_letter_records"),
            ["group"],
            registry=registry,
        ).labels(group)
        self._dlq_oldest_ms: int | None = None
        Gauge(
            base_name("ds_sidecar_dead_letter_oldest_age_seconds"),
            help_of("ds_sidecar_dead_letter_oldest_age_seconds"),
            ["group"],
            registry=registry,
        ).labels(group).set_function(self._dlq_age)
        self._offset_gaps = Counter(
            base_name("ds_sidecar_offset_gaps_total"),
            help_of("ds_sidecar_offset_gaps_total"),
            ["group", "topic", "partition"],
            registry=registry,
        )
        self._gap_histogram = _table_histogram(
            "ds_partition_not_fetching_seconds", GAP_BUCKETS, registry
        )
        self._handoff_histogram = _table_histogram(
            "ds_sidecar_handoff_gap_seconds", REQUEST_BUCKETS, registry
        )
        self._fetch_sizes = FetchSizes()
        self._fetch_size = _table_histogram("ds_sidecar_fetch_size_bytes", SIZE_BUCKETS, registry)
        self._fetch_records = _table_histogram(
            "ds_sidecar_fetch_records_per_request", RECORD_COUNT_BUCKETS, registry
        )
        self._fetch_size_all = _table_histogram(
            "ds_sidecar_fetch_size_all_bytes", SIZE_BUCKETS, registry
        ).labels(group)
        self.gaps: NotFetching | None = None
        self.clients = ClientMetrics(group, ClientIdLimiter(max_client_ids, client_idle_seconds))
        registry.register(self.clients)
        self._registry = registry
        self.view: SidecarCollector | None = None

    def watch(
        self, table: PartitionTable, last_poll: Callable[[], float], connected: Callable[[], bool]
    ) -> SidecarCollector:
        """Register the scrape-time view of the partition table and statistics (with the
        not-fetching gaps when the counting hooks are enabled: they are fed by them)."""
        self.view = SidecarCollector(self.group, table, last_poll, connected)
        if self.enabled:
            self.gaps = NotFetching(
                self.group,
                table,
                self.view.statistics,
                self._gap_histogram,
                self._handoff_histogram,
            )
            self.view.gaps = self.gaps
        self._registry.register(self.view)
        return self.view

    # ---- hooks (each on the thread named) -------------------------------------------------

    def consumed(self, topic: str, records: int, nbytes: int) -> None:
        """Fetch thread: one partition run of a consume() batch."""
        children = self._per_topic.get(topic)
        if children is None:
            children = self._per_topic[topic] = (
                self._consumed_records.labels(self.group, topic),
                self._consumed_bytes.labels(self.group, topic),
            )
        children[0].inc(records)
        children[1].inc(nbytes)

    def committed(self, ok: bool, seconds: float) -> None:
        """Fetch thread: one commit request to Kafka."""
        (self._commit_ok if ok else self._commit_error).inc()
        self._commit_latency.observe(seconds)

    def lease_changed(self, kind: str) -> None:
        """asyncio thread: a grant, revoke or local expiry."""
        self._lease_changes[kind].inc()
        self._last_lease_change.set(time.time())

    def lease_settled(self, kind: str, seconds: float) -> None:
        self._lease_latency[kind].observe(seconds)

    def redelivered(self, reason: str, records: int) -> None:
        """asyncio thread: records came due to be delivered again."""
        self._redeliveries.labels(self.group, reason).inc(records)

    def gave_up(self, records: int) -> None:
        """asyncio thread: records given up past the delivery limit."""
        self._given_up.inc(records)

    def dead_letter_depth(self, records: int, oldest_ms: int | None) -> None:
        """asyncio thread: what the dead-letter topic keeps, and its oldest record's
        timestamp (None: nothing kept); the age is computed at scrape time."""
        self._dlq_records.set(records)
        self._dlq_oldest_ms = oldest_ms

    def _dlq_age(self) -> float:
        oldest = self._dlq_oldest_ms
        return 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)

    def dead_lettered(self, records: int) -> None:
        """asyncio thread: records on the dead-letter topic, acked by Kafka."""
        self._dead_lettered.inc(records)

    def offset_gap(self, topic: str, partition: int, skipped: int) -> None:
        """Fetch thread: offsets skipped because the position fell outside the log."""
        self._offset_gaps.labels(self.group, topic, str(partition)).inc(skipped)

    def heartbeat_sent(self) -> None:
        self._heartbeats.inc()

    def heartbeat_acked(self, seconds: float) -> None:
        self._heartbeat_rtt.observe(seconds)
        self._last_heartbeat.set(time.time())

    # Coordinator metrics: leased mode's from the session and lease keeper (asyncio thread),
    # kafka_group mode's from the rebalance callbacks (fetch thread; classic.RebalanceEvents).

    def joined(self, ok: bool, seconds: float | None) -> None:
        """A join by result, with its seconds when its start was seen."""
        self._joins[ok].inc()
        if seconds is not None:
            self._join_seconds.observe(seconds)

    def synced(self, seconds: float) -> None:
        self._sync_seconds.observe(seconds)

    def partitions_lost(self, seconds: float) -> None:
        """One partition lost: a lease expiry's latency, or on_lost's handling time."""
        self._lost_seconds.observe(seconds)

    def statistics(self, stats: Statistics) -> None:
        """Fetch thread (stats_cb): the latest statistics, and the fetch sizes of the
        window since the previous one (counting hooks enabled only)."""
        if self.view is not None:
            self.view.apply_statistics(stats)
        if self.enabled:
            self._observe_fetch_sizes(self._fetch_sizes.add(stats))

    def _observe_fetch_sizes(self, windows: FetchWindows) -> None:
        if windows.total is not None:
            self._fetch_size_all.observe(windows.total.bytes_per_request)
        for window in windows.topics:
            self._fetch_size.labels(self.group, window.topic).observe(window.bytes_per_request)
            self._fetch_records.labels(self.group, window.topic).observe(window.records_per_request)
