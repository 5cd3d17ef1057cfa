"""librdkafka's statistics and error callbacks, onto the table, the metrics and the faults.

Both run on the fetch thread, inside ``consume()`` (``stats_cb`` every
``statistics.interval.ms``, ``error_cb`` on every client error), for the fetch consumer in
either mode and, for errors, for the commit consumer too.
"""

from __future__ import annotations

import structlog
from confluent_kafka import KafkaError

from services.consumer_sidecar.fault_emitters import SidecarFaults
from services.consumer_sidecar.metrics import SidecarMetrics
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.stats import parse_statistics
from services.runtime.kafka import ErrorLogLimiter, classify

log = structlog.get_logger(__name__)


class KafkaCallbacks:
    def __init__(
        self, table: PartitionTable, metrics: SidecarMetrics, faults: SidecarFaults
    ) -> None:
        self._table = table
        self._metrics = metrics
        self._faults = faults
        self._error_log = ErrorLogLimiter()

    def on_stats(self, document: str) -> None:
        """High watermarks and lag into the table; broker figures to the metrics; whether
        any broker is up to the fault hooks."""
        stats = parse_statistics(document)
        self._table.apply_stats(stats.partitions)
        self._metrics.statistics(stats)
        self._faults.brokers_up(document)

    def on_error(self, error: KafkaError) -> None:
        """Counted by kind and code, reported as a fault, logged (repeats rate-limited)."""
        kind = classify(error)
        self._metrics.kafka_errors.labels(kind, error.name()).inc()
        self._faults.kafka_error(error.name(), error.str())
        if self._error_log.should_log(error):
            log.warning(
                "kafka error",
                kind=kind,
                code=error.name(),
                error=error.str(),
                repeated_since_last_log=self._error_log.take_suppressed(error),
            )
