"""Sidecar wiring and lifecycle: Kafka fetch thread, assigner session, commits, servicer.

The group's mode arrives with the session (``SessionAccepted.mode``): ``leased`` (the
default; the assigner grants partitions) or ``kafka_group`` (compatibility mode,
:mod:`services.consumer_sidecar.classic`: Kafka's group coordinator assigns them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
import structlog
from confluent_kafka import Consumer, KafkaError
from prometheus_client import CollectorRegistry, ProcessCollector

from dataservice.assigner.v1 import assigner_pb2
from dataservice.common.v1 import common_pb2
from services.consumer_sidecar.classic import ClassicMembership, classic_overrides, group_topics
from services.consumer_sidecar.client_access import AccessInterceptor
from services.consumer_sidecar.faults import SidecarFaults
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.metrics import SidecarMetrics
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.rpc import StreamServicer, add_to_server
from services.consumer_sidecar.session import SessionClient, SessionIdentity
from services.consumer_sidecar.settings import SidecarSettings
from services.consumer_sidecar.stats import parse_statistics
from services.runtime.grpcserver import GrpcServer, GrpcService
from services.runtime.http import Route
from services.runtime.kafka import (
    ErrorLogLimiter,
    KafkaProbe,
    classify,
    consumer_config,
    new_consumer,
)
from services.runtime.lifecycle import Dependency
from services.runtime.reporter import reporter_for

log = structlog.get_logger(__name__)

# librdkafka settings the sidecar needs whatever the group config says.
_SIDECAR_CONSUMER_DEFAULTS: dict[str, object] = {
    # Keep librdkafka's own prefetch queue small: the sidecar's buffer is the real one
    # and must bound memory (backpressure pauses partitions past the cap).
    "queued.max.messages.kbytes": 8192,
    # One fetch response may not dwarf the cap either (librdkafka's default is 50 MiB).
    "fetch.max.bytes": 8 * 1024 * 1024,
    "fetch.wait.max.ms": 100,
    # With a queue that small, one fetch response fills it, and librdkafka then postpones
    # the partitions' next fetch by fetch.queue.backoff.ms (default 1000 ms): records/s
    # fell to a fifth. Fetch again as soon as the queue has drained below the threshold.
    "fetch.queue.backoff.ms": 10,
}
_SECRET_KEYS = ("password", "secret", "token", "key.pem")


class SidecarApp:
    name = "ds-sidecar"

    def __init__(self, settings: SidecarSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.metrics = SidecarMetrics(
            self.registry,
            settings.group,
            enabled=settings.metrics_enabled,
            max_client_ids=settings.metrics_max_client_ids,
            client_idle_seconds=settings.metrics_client_idle_seconds,
        )
        self.kafka_errors = self.metrics.kafka_errors
        self._error_log = ErrorLogLimiter()
        self.table = PartitionTable(settings.buffer_max_bytes, time.monotonic)
        self.data_ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe = KafkaProbe(settings, client_id=f"ds-sidecar-{settings.id}")
        fetch_config = consumer_config(
            settings,
            group=settings.group,
            client_id=f"ds-sidecar-{settings.id}",
            overrides={
                **_SIDECAR_CONSUMER_DEFAULTS,
                "statistics.interval.ms": settings.statistics_interval_ms,
                "stats_cb": self._on_stats,
            },
            error_cb=self._on_kafka_error,
        )
        consumer = Consumer(fetch_config)
        committer = new_consumer(
            settings,
            group=settings.group,
            client_id=f"ds-sidecar-{settings.id}-commit",
            error_cb=self._on_kafka_error,
        )
        self.fetcher = Fetcher(
            consumer,
            self.table,
            sidecar_id=settings.id,
            batch=settings.consume_batch,
            on_data=self._notify_data,
            on_error=self._on_kafka_error,
            committer=committer,
            prefetch_bytes=int(fetch_config["queued.max.messages.kbytes"]) * 1024,
        )
        self.keeper = LeaseKeeper(
            self.table,
            self.fetcher,
            commit_interval=settings.commit_interval_seconds,
            commit_max_acks=settings.commit_max_acks,
        )
        self.session = SessionClient(
            SessionIdentity(
                sidecar_id=settings.id,
                group=settings.group,
                endpoint="",  # known once the gRPC port is bound (on_ready)
                zone=settings.zone,
                capacity=settings.capacity,
            ),
            settings.assigner,
            self.keeper,
            safety_margin=settings.lease_safety_margin_seconds,
            consul=settings.consul,
        )
        self.session.on_accepted = self._on_accepted
        self.reporter = reporter_for(settings, "sidecar", settings.id, self.registry)
        self.faults = SidecarFaults(self.reporter, settings.group, settings.id)
        self.keeper.on_commit = self.faults.commit
        self._wire_metrics()
        # kafka_group mode only: Kafka's rebalance callbacks onto the partition table.
        self.classic: ClassicMembership | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _wire_metrics(self) -> None:
        """Scrape-time views always; the counting hooks unless metrics are disabled."""
        fetcher = self.fetcher
        self.metrics.watch(self.table, lambda: fetcher.last_poll, lambda: self.session.connected)
        if not self.metrics.enabled:
            return
        fetcher.on_poll = self.metrics.polls.polled
        fetcher.on_consumed = self.metrics.consumed
        fetcher.on_commit_request = self.metrics.committed
        self.keeper.on_lease_change = self.metrics.lease_changed
        self.keeper.on_lease_settled = self.metrics.lease_settled
        self.session.on_heartbeat_sent = self.metrics.heartbeat_sent
        self.session.on_heartbeat_acked = self.metrics.heartbeat_acked

    def grpc_interceptors(self) -> Sequence[grpc.aio.ServerInterceptor]:  # type: ignore[type-arg]
        """Client-access metrics: every StreamService call by client, method and code."""
        if not self.metrics.enabled:
            return ()
        return (AccessInterceptor(self.metrics.clients),)

    # ---- Service protocol -----------------------------------------------------------------

    def grpc_services(self) -> Sequence[GrpcService]:
        return [
            GrpcService(
                "dataservice.sidecar.v1.StreamService",
                StreamServicer(
                    self, clients=self.metrics.clients if self.metrics.enabled else None
                ),
                add_to_server,
            )
        ]

    def dependencies(self) -> Sequence[Dependency]:
        return [self._probe]

    def http_routes(self) -> Mapping[str, Route]:
        return {}

    def instance_meta(self) -> Mapping[str, str]:
        return {"group": self.settings.group, "sidecar_id": self.settings.id}

    async def on_ready(self, server: GrpcServer) -> None:
        self._loop = asyncio.get_running_loop()
        endpoint = f"{self.settings.advertised}:{server.port}"
        self.session.identity = SessionIdentity(
            sidecar_id=self.settings.id,
            group=self.settings.group,
            endpoint=endpoint,
            zone=self.settings.zone,
            capacity=self.settings.capacity,
        )
        self.fetcher.start()
        self._tasks.append(asyncio.create_task(self.session.run(), name="session"))
        self._tasks.append(asyncio.create_task(self.keeper.commit_loop(), name="commits"))
        self.reporter.start()
        self._tasks.append(asyncio.create_task(self._watch_backpressure(), name="backpressure"))

    async def drain(self) -> None:
        """SIGTERM: hand every partition off cooperatively (commit acked offsets first)."""
        if self._loop is None:
            return
        if self.classic is not None:
            # kafka_group: stop delivering, wait for in-flight acks (clients still send
            # them here), commit; then leave the assigner. The consumer closes in close();
            # as a static member it keeps its place in the Kafka group for
            # session.timeout.ms, so a quick restart moves no partition.
            await self.fetcher.run(self.classic.release_all)
        await self.session.leave(timeout=self.settings.shutdown_grace_seconds)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._loop is not None:
            await asyncio.to_thread(self.fetcher.stop)
        await asyncio.to_thread(self.reporter.close)

    # ---- kafka_group mode -------------------------------------------------------------

    def _on_accepted(self, accepted: assigner_pb2.SessionAccepted) -> None:
        """Every (re-)join. The first one in kafka_group mode switches Kafka consumption
        to subscribe(); the mode never changes while the process runs."""
        if self.session.mode != common_pb2.GROUP_MODE_KAFKA_GROUP or self.classic is not None:
            return
        self.classic = ClassicMembership(
            self.table, self.fetcher, drain_timeout=self.settings.drain_timeout_seconds
        )
        self._tasks.append(
            asyncio.create_task(
                self._start_classic(dict(accepted.consumer_config), list(accepted.topics)),
                name="kafka-group",
            )
        )

    async def _start_classic(self, group_config: dict[str, str], topics: list[str]) -> None:
        assert self.classic is not None
        # The assigner sends the topics with SessionAccepted; an older one does not.
        topics = topics or await group_topics(self.session.follower, self.settings.group)
        config = consumer_config(
            self.settings,
            group=self.settings.group,
            client_id=f"ds-sidecar-{self.settings.id}",
            overrides={
                **_SIDECAR_CONSUMER_DEFAULTS,
                "statistics.interval.ms": self.settings.statistics_interval_ms,
                "stats_cb": self._on_stats,
                **classic_overrides(self.settings.id, group_config),
            },
            error_cb=self._on_kafka_error,
        )
        await self.fetcher.run(self.fetcher.use_classic, config, topics, self.classic)
        log.info(
            "kafka_group mode: subscribed",
            topics=topics,
            group_instance_id=self.settings.id,
            assignor=config["partition.assignment.strategy"],
        )

    # ---- helpers --------------------------------------------------------------------

    def _on_stats(self, document: str) -> None:
        """librdkafka statistics (on the fetch thread): high watermarks, lag, broker figures."""
        stats = parse_statistics(document)
        self.table.apply_stats(stats.partitions)
        self.metrics.statistics(stats)
        self.faults.brokers_up(document)

    async def _watch_backpressure(self) -> None:
        """CLIENT_BACKPRESSURE: partitions not fetching because the buffer is full (paused
        past their cap, or all of them while consumption is held back), not by their lease."""
        while True:
            await asyncio.sleep(1.0)
            holding = self.table.holding
            self.faults.backpressure(
                (p.tp.topic, p.tp.partition)
                for p in self.table.snapshot()
                if (p.paused or (holding and p.ready)) and p.suspended_at is None
            )

    def _notify_data(self) -> None:
        """Called on the fetch thread when records were buffered."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.data_ready.set)

    def _on_kafka_error(self, error: KafkaError) -> None:
        kind = classify(error)
        self.kafka_errors.labels(kind, error.name()).inc()
        self.faults.kafka_error(error.name(), error.str())
        if self._error_log.should_log(error):
            log.warning(
                "kafka error",
                kind=kind,
                code=error.name(),
                error=error.str(),
                repeated_since_last_log=self._error_log.take_suppressed(error),
            )

    def effective_config(self) -> dict[str, str]:
        overrides = dict(_SIDECAR_CONSUMER_DEFAULTS)
        if self.classic is not None:
            overrides.update(classic_overrides(self.settings.id, {}))
        config: dict[str, Any] = consumer_config(
            self.settings,
            group=self.settings.group,
            client_id=f"ds-sidecar-{self.settings.id}",
            overrides=overrides,
        )
        config.pop("logger", None)
        return {
            key: ("***" if any(s in key for s in _SECRET_KEYS) else str(value))
            for key, value in sorted(config.items())
        }
