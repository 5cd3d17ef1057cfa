"""librdkafka's statistics and error callbacks, onto the table, the metrics and the faults.

Both run on the fetch thread, inside ``consume()`` (``stats_cb`` every
``statistics.interval.ms``, ``error_cb`` on every client error), for the fetch consumer in
either mode and, for errors, for the commit consumer too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from confluent_kafka import KafkaError

from services.consumer_sidecar.broker_loss import BrokerLoss
from services.consumer_sidecar.fault_emitters import SidecarFaults
from services.consumer_sidecar.metrics import SidecarMetrics
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.stats import knows_a_broker, parse_statistics
from services.runtime.kafka import ErrorLogLimiter, classify

log = structlog.get_logger(__name__)


def _nothing() -> None:
    pass


class KafkaCallbacks:
    """``on_broker_loss``: the fetch consumer has known no broker for a while
    (broker_loss.py); called once, on the fetch thread, until :meth:`replaced`."""

    def __init__(
        self,
        table: PartitionTable,
        metrics: SidecarMetrics,
        faults: SidecarFaults,
        on_broker_loss: Callable[[], None] = _nothing,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._table = table
        self._metrics = metrics
        self._faults = faults
        self._error_log = ErrorLogLimiter()
        self._on_broker_loss = on_broker_loss
        self._clock = clock
        self.broker_loss = BrokerLoss()

    def on_stats(self, document: str) -> None:
        """High watermarks and lag into the table; broker figures to the metrics; whether
        any broker is up to the fault hooks; whether the consumer still knows a broker."""
        stats = parse_statistics(document)
        self._table.apply_stats(stats.partitions)
        self._metrics.statistics(stats)
        self._faults.brokers_up(document)
        if self.broker_loss.seen(knows_a_broker(stats), self._clock()):
            log.warning(
                "the fetch consumer knows no broker any more (librdkafka forgot them all "
                "after the cluster was away); replacing it",
                brokers=sorted(stats.brokers),
                seconds=self.broker_loss.after,
            )
            self._on_broker_loss()

    def replaced(self) -> None:
        """A new fetch consumer took over (or the attempt ended): watch afresh."""
        self.broker_loss.replaced()

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
