"""Notifier wiring: publishes fault events to Kafka (``ds.faults``, keyed by group)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence

import structlog
from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.cimpl import NewTopic
from prometheus_client import CollectorRegistry, Counter, ProcessCollector

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2_grpc
from services.notifier.rpc import NotifierServicer
from services.notifier.settings import NotifierSettings
from services.runtime.errors import DsError, Reason
from services.runtime.grpcserver import GrpcServer, GrpcService
from services.runtime.http import Route
from services.runtime.kafka import KafkaProbe, new_admin, new_producer
from services.runtime.lifecycle import Dependency

log = structlog.get_logger(__name__)


class NotifierApp:
    name = "ds-notifier"

    def __init__(self, settings: NotifierSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.published = Counter(
            "ds_notifier_faults_published",
            "Fault events published to Kafka",
            ["type", "state"],
            registry=self.registry,
        )
        self.recent: deque[common_pb2.FaultEvent] = deque(maxlen=settings.recent_faults)
        self.watchers: set[asyncio.Queue[common_pb2.FaultEvent]] = set()
        self._admin = new_admin(settings, client_id="ds-notifier")
        self._probe = KafkaProbe(settings, client_id="ds-notifier", admin=self._admin)
        self._producer = new_producer(settings, client_id="ds-notifier")
        self._poller: asyncio.Task[None] | None = None

    def grpc_services(self) -> Sequence[GrpcService]:
        return [
            GrpcService(
                "dataservice.notifier.v1.NotifierService",
                NotifierServicer(self),
                notifier_pb2_grpc.add_NotifierServiceServicer_to_server,
            )
        ]

    def dependencies(self) -> Sequence[Dependency]:
        return [self._probe]

    def http_routes(self) -> Mapping[str, Route]:
        return {}

    def instance_meta(self) -> Mapping[str, str]:
        return {}

    async def on_ready(self, server: GrpcServer) -> None:
        await asyncio.to_thread(self._ensure_topic)
        self._poller = asyncio.create_task(self._poll_producer(), name="producer-poll")

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        remaining = await asyncio.to_thread(self._producer.flush, 10)
        if remaining:
            log.error("fault events not delivered at shutdown", count=remaining)

    def _ensure_topic(self) -> None:
        topic = NewTopic(
            self.settings.faults_topic,
            self.settings.faults_topic_partitions,
            self.settings.faults_topic_replication,
        )
        for future in self._admin.create_topics([topic]).values():
            try:
                future.result()
                log.info("created faults topic", topic=self.settings.faults_topic)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

    async def _poll_producer(self) -> None:
        while True:
            await asyncio.to_thread(self._producer.poll, 0.5)

    async def publish(self, event: common_pb2.FaultEvent) -> common_pb2.FaultEvent:
        """Publish and wait for Kafka's ack (acks=all, idempotent producer)."""
        event = common_pb2.FaultEvent.FromString(event.SerializeToString())  # own copy
        if not event.id:
            event.id = str(uuid.uuid4())
        if not event.HasField("detected_at"):
            event.detected_at.FromNanoseconds(time.time_ns())
        loop = asyncio.get_running_loop()
        delivered: asyncio.Future[None] = loop.create_future()

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                loop.call_soon_threadsafe(delivered.set_result, None)
            else:
                loop.call_soon_threadsafe(delivered.set_exception, KafkaException(err))

        self._producer.produce(
            self.settings.faults_topic,
            key=event.group.encode(),
            value=event.SerializeToString(),
            headers={
                "content-type": b"application/x-protobuf; type=dataservice.common.v1.FaultEvent"
            },
            on_delivery=on_delivery,
        )
        try:
            await asyncio.wait_for(delivered, 30)
        except (TimeoutError, KafkaException) as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, f"fault event not published: {exc}") from exc
        self.published.labels(
            common_pb2.FaultType.Name(event.type), common_pb2.FaultState.Name(event.state)
        ).inc()
        self.recent.append(event)
        for queue in list(self.watchers):
            if not queue.full():
                queue.put_nowait(event)
        log.info(
            "fault published",
            type=common_pb2.FaultType.Name(event.type),
            group=event.group,
            id=event.id,
        )
        return event
