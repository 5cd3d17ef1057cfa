"""Every metric of the notifier, declared against one injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.runtime.lag import GroupLag


class NotifierMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reports = Counter(
            "ds_notifier_reports",
            "Fault reports received (ReportFault and the lag evaluator)",
            ["type", "state"],
            registry=registry,
        )
        self.published = Counter(
            "ds_notifier_faults_published",
            "Fault events confirmed by Kafka",
            ["type", "state"],
            registry=registry,
        )
        self.suppressed = Counter(
            "ds_notifier_faults_suppressed",
            "Fault reports suppressed by storm suppression (counted on a later event)",
            ["type"],
            registry=registry,
        )
        self.outbox_pending = Gauge(
            "ds_notifier_outbox_pending",
            "Items in the durable outbox not yet delivered",
            ["lane"],
            registry=registry,
        )
        self.reconciled = Counter(
            "ds_notifier_outbox_reconciled",
            "Pending outbox items found already published (not sent again)",
            registry=registry,
        )
        self.dead_letters = Counter(
            "ds_notifier_outbox_dead_letters",
            "Outbox items dropped on a permanent delivery error",
            ["kind"],
            registry=registry,
        )
        self.alerts = Counter(
            "ds_notifier_alerts",
            "Rendered alerts queued, by caller and route kind",
            ["caller", "route"],
            registry=registry,
        )
        self.alerts_delivered = Counter(
            "ds_notifier_alerts_delivered",
            "Rendered alerts confirmed by their destination",
            ["route"],
            registry=registry,
        )
        self.alerts_rate_limited = Counter(
            "ds_notifier_alerts_rate_limited",
            "Alerts held back by a template's send interval",
            ["caller"],
            registry=registry,
        )
        self.template_errors = Counter(
            "ds_notifier_template_render_errors",
            "Alert templates that failed to render (the alert carries the error)",
            ["caller"],
            registry=registry,
        )
        self.lag_records = Gauge(
            "ds_group_lag_records",
            "Consumer group lag in records (high watermark - committed offset; from the log "
            "start when retention deleted records not yet consumed)",
            ["group", "topic", "partition"],
            registry=registry,
        )
        self.lag_seconds = Gauge(
            "ds_group_lag_seconds",
            "Consumer group lag in seconds (age of the first unconsumed record, interpolated "
            "from the high-watermark history)",
            ["group", "topic", "partition"],
            registry=registry,
        )
        self.partition_status = Gauge(
            "ds_group_partition_status",
            "Burrow status of a partition: 1 OK, 2 WARN, 4 STOP, 5 STALL, 6 REWIND",
            ["group", "topic", "partition"],
            registry=registry,
        )
        self.group_status = Gauge(
            "ds_group_status",
            "Burrow status of a group (worst partition; STOP/STALL/REWIND count as 3 ERR)",
            ["group"],
            registry=registry,
        )
        self.lag_evaluations = Counter(
            "ds_notifier_lag_evaluations", "Lag evaluation rounds", registry=registry
        )
        self.lag_poll_errors = Counter(
            "ds_notifier_lag_poll_errors",
            "Failed high-watermark polls (retried next round)",
            registry=registry,
        )
        self._lag_labels: set[tuple[str, str, str]] = set()
        self._group_labels: set[str] = set()

    def set_lag(self, groups: list[GroupLag]) -> None:
        """Export the latest evaluation; series of partitions no longer seen are removed."""
        seen: set[tuple[str, str, str]] = set()
        for group in groups:
            self.group_status.labels(group.group).set(int(group.status))
            for p in group.partitions:
                labels = (group.group, p.topic, str(p.partition))
                seen.add(labels)
                self.lag_records.labels(*labels).set(p.lag_records)
                self.lag_seconds.labels(*labels).set(p.lag_seconds)
                self.partition_status.labels(*labels).set(int(p.status))
        for labels in self._lag_labels - seen:
            for gauge in (self.lag_records, self.lag_seconds, self.partition_status):
                gauge.remove(*labels)
        names = {g.group for g in groups}
        for name in self._group_labels - names:
            self.group_status.remove(name)
        self._lag_labels = seen
        self._group_labels = names


# Round trips of a healthy mesh are tens of milliseconds; the top buckets reach the
# default probe timeout (30 s), past which a probe counts as lost instead.
PROBE_ROUNDTRIP_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
)  # fmt: skip


class ProbeMetrics:
    """The end-to-end probe's metrics (declared only when the probe is enabled, so a
    notifier without it exports no probe series an alert could misread)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent = Counter(
            "ds_probe_sent",
            "Probe records produced to the probe topic",
            ["partition"],
            registry=registry,
        )
        self.received = Counter(
            "ds_probe_received",
            "Probe records consumed back through the mesh within the probe timeout",
            registry=registry,
        )
        self.lost = Counter(
            "ds_probe_lost",
            "Probe records not consumed through the mesh within the probe timeout",
            ["partition"],
            registry=registry,
        )
        self.late = Counter(
            "ds_probe_late",
            "Probe records consumed after they had been counted lost",
            registry=registry,
        )
        self.discarded = Counter(
            "ds_probe_discarded",
            "Records of the probe topic not counted: another instance's or an earlier run's "
            "probes (foreign), second deliveries (duplicate), not a probe (undecodable)",
            ["reason"],
            registry=registry,
        )
        self.produce_errors = Counter(
            "ds_probe_produce_errors",
            "Probe records the producer could not deliver to Kafka (not counted as lost)",
            registry=registry,
        )
        self.roundtrip = Histogram(
            "ds_probe_roundtrip_seconds",
            "Probe round trip: produced by the notifier until received by its probe consumer "
            "through the mesh (probes received within the timeout)",
            buckets=PROBE_ROUNDTRIP_BUCKETS,
            registry=registry,
        )
        self.last_success = Gauge(
            "ds_probe_last_success_timestamp_seconds",
            "Unix time of the last probe received within the timeout (0 = none yet)",
            registry=registry,
        )
        self.in_flight = Gauge(
            "ds_probe_in_flight",
            "Probes sent and neither received nor counted lost yet",
            registry=registry,
        )
        self.consumer_errors = Counter(
            "ds_probe_consumer_errors",
            "Failures of the probe consumer (group creation, bind, fetch); retried",
            registry=registry,
        )
