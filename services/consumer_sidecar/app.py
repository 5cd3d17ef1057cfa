"""Sidecar wiring and lifecycle: Kafka fetch thread, assigner session, commits, servicer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry, Counter, ProcessCollector

from dataservice.sidecar.v1 import stream_pb2_grpc
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.rpc import StreamServicer
from services.consumer_sidecar.session import SessionClient, SessionIdentity
from services.consumer_sidecar.settings import SidecarSettings
from services.consumer_sidecar.stats import parse_partition_stats
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

log = structlog.get_logger(__name__)

# librdkafka settings the sidecar needs whatever the group config says.
_SIDECAR_CONSUMER_DEFAULTS: dict[str, object] = {
    # Keep librdkafka's own prefetch queue small: the sidecar's buffer is the real one
    # and must bound memory (backpressure pauses partitions past the cap).
    "queued.max.messages.kbytes": 16384,
    "fetch.wait.max.ms": 100,
}
_SECRET_KEYS = ("password", "secret", "token", "key.pem")


class SidecarApp:
    name = "ds-sidecar"

    def __init__(self, settings: SidecarSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.kafka_errors = Counter(
            "ds_sidecar_kafka_errors",
            "librdkafka errors by class",
            ["kind", "code"],
            registry=self.registry,
        )
        self._error_log = ErrorLogLimiter()
        self.table = PartitionTable(settings.buffer_max_bytes, time.monotonic)
        self.data_ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe = KafkaProbe(settings, client_id=f"ds-sidecar-{settings.id}")
        consumer = new_consumer(
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
        self.fetcher = Fetcher(
            consumer,
            self.table,
            sidecar_id=settings.id,
            batch=settings.consume_batch,
            on_data=self._notify_data,
            on_error=self._on_kafka_error,
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
        self._tasks: list[asyncio.Task[None]] = []

    # ---- Service protocol -----------------------------------------------------------------

    def grpc_services(self) -> Sequence[GrpcService]:
        return [
            GrpcService(
                "dataservice.sidecar.v1.StreamService",
                StreamServicer(self),
                stream_pb2_grpc.add_StreamServiceServicer_to_server,
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

    async def drain(self) -> None:
        """SIGTERM: hand every partition off cooperatively (commit acked offsets first)."""
        if self._loop is None:
            return
        await self.session.leave(timeout=self.settings.shutdown_grace_seconds)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._loop is not None:
            await asyncio.to_thread(self.fetcher.stop)

    # ---- helpers --------------------------------------------------------------------

    def _on_stats(self, document: str) -> None:
        """librdkafka statistics (on the fetch thread): high watermarks and lag."""
        self.table.apply_stats(parse_partition_stats(document))

    def _notify_data(self) -> None:
        """Called on the fetch thread when records were buffered."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.data_ready.set)

    def _on_kafka_error(self, error: KafkaError) -> None:
        kind = classify(error)
        self.kafka_errors.labels(kind, error.name()).inc()
        if self._error_log.should_log(error):
            log.warning(
                "kafka error",
                kind=kind,
                code=error.name(),
                error=error.str(),
                repeated_since_last_log=self._error_log.take_suppressed(error),
            )

    def effective_config(self) -> dict[str, str]:
        config: dict[str, Any] = consumer_config(
            self.settings,
            group=self.settings.group,
            client_id=f"ds-sidecar-{self.settings.id}",
            overrides=_SIDECAR_CONSUMER_DEFAULTS,
        )
        config.pop("logger", None)
        return {
            key: ("***" if any(s in key for s in _SECRET_KEYS) else str(value))
            for key, value in sorted(config.items())
        }
