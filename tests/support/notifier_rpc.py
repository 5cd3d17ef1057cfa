"""NotifierService through an in-process gRPC server, without a Kafka broker: the harness of
tests/unit/notifier/test_rpc.py (and of tests/k8s, where it runs behind the authorization
interceptor reviewing tokens against a real API server).

The real servicer runs on a real grpc.aio server on port 0 over the real fault pipeline
(storm suppression, the SQLite outbox, alert routing, the history and its watchers) and the
real template service. Only Kafka I/O at the edge is replaced: the Kafka relay by
:class:`KafkaEdge`, which confirms every queued item as Kafka would, and the compacted
template topic by :class:`MemoryTemplateStore`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dsclient.reasons import DOMAIN, error_info
from services.notifier.alerts import AlertRouter
from services.notifier.egress import EgressPolicy
from services.notifier.history import FaultHistory
from services.notifier.metrics import NotifierMetrics
from services.notifier.outbox import KAFKA_LANE, MAX_PENDING_PER_DESTINATION, Outbox, OutboxItem
from services.notifier.pipeline import FaultPipeline, Wake
from services.notifier.relay import RelayHooks
from services.notifier.render_relay import RenderRelay
from services.notifier.rpc import NotifierServicer
from services.notifier.settings import NotifierSettings
from services.notifier.template_service import TemplateService
from services.runtime.auth import AuthSettings, build_guard
from services.runtime.grpcserver import GrpcService, create_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT
FAULTS_TOPIC = "ds.faults"
# Webhooks may go to host "h", which resolves (in these tests) to a public address.
EGRESS = EgressPolicy(["h"])
PUBLIC_ADDRESS = "192.0.43.10"


def kafka_down() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))


class KafkaEdge:
    """Stands in for ``relay.KafkaRelay``: when woken, every item pending on the Kafka lane
    is confirmed as Kafka would confirm it, handed to the pipeline's delivery hook and
    forgotten by the outbox together with what its delivery caused (the alerts' render
    jobs, which the render relay then renders, in step)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.hooks: RelayHooks | None = None
        self.render: RenderRelay | None = None
        self.published: list[OutboxItem] = []

    def notify(self) -> None:
        assert self.hooks is not None
        while True:
            items = self.outbox.pending(KAFKA_LANE, 1000)
            if items:
                follow_ups = self.hooks.delivered(items)
                self.hooks.report_dead_letters(
                    self.outbox.complete([item.seq for item in items], follow_ups)
                )
                self.published.extend(items)
            rendered = self.render.round() if self.render is not None else 0
            if not items and not rendered:
                return

    def to(self, destination: str) -> list[OutboxItem]:
        return [item for item in self.published if item.destination == destination]


class MemoryTemplateStore:
    """``template_store.TemplateStore`` without its compacted topic: writes land in a dict,
    or fail as a Kafka outage would when ``failure`` is set."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], notifier_pb2.AlertTemplate] = {}
        self.failure: Exception | None = None

    def all(self) -> list[notifier_pb2.AlertTemplate]:
        return [self.records[key] for key in sorted(self.records)]

    def get(self, caller: str, name: str) -> notifier_pb2.AlertTemplate | None:
        return self.records.get((caller, name))

    async def put(self, template: notifier_pb2.AlertTemplate) -> None:
        if self.failure is not None:
            raise self.failure
        self.records[(template.caller, template.name)] = template

    async def delete(self, caller: str, name: str) -> None:
        if self.failure is not None:
            raise self.failure
        self.records.pop((caller, name), None)


@dataclass
class AlertTopics:
    """The Kafka admin edge of a Kafka route: which alerts topics were ensured."""

    created: list[str] = field(default_factory=list)
    failure: Exception | None = None

    def ensure(self, topic: str) -> None:
        if self.failure is not None:
            raise self.failure
        self.created.append(topic)


@dataclass
class Notifier:
    stub: notifier_pb2_grpc.NotifierServiceStub
    outbox: Outbox
    kafka: KafkaEdge
    store: MemoryTemplateStore
    topics: AlertTopics
    ready: threading.Event  # the template store has loaded its topic
    registry: CollectorRegistry  # the notifier's metrics
    pipeline: FaultPipeline  # its timer is the app's (not run here): tests drive tick()


Body = Callable[[Notifier], Awaitable[None]]


def run(
    tmp_path: Path,
    body: Body,
    *,
    auth: AuthSettings | None = None,
    max_pending_per_destination: int = MAX_PENDING_PER_DESTINATION,
    dead_letters_max: int = 10_000,
) -> None:
    """``body`` against the notifier; ``auth``: behind the authorization interceptor with
    those settings, as the service runs it (audience ds-notifier); the outbox's bounds."""

    async def main() -> None:
        settings = NotifierSettings(
            grpc_port=0,
            http_port=0,
            faults_topic=FAULTS_TOPIC,
            outbox_path=tmp_path / "outbox.sqlite",
            suppression_window_seconds={"*": 60.0},
        )
        registry = CollectorRegistry()
        metrics = NotifierMetrics(registry)
        outbox = Outbox(
            settings.resolved_outbox_path(),
            dead_letters_max=dead_letters_max,
            max_pending_per_destination=max_pending_per_destination,
        )
        kafka = KafkaEdge(outbox)
        store = MemoryTemplateStore()
        topics = AlertTopics()
        ready = threading.Event()
        ready.set()
        router = AlertRouter(
            store.all,
            topic_prefix=settings.alerts_topic_prefix,
            metrics=metrics,
            clock=time.monotonic,
        )
        pipeline = FaultPipeline(
            settings,
            outbox=outbox,
            history=FaultHistory([], size=settings.recent_faults),
            router=router,
            metrics=metrics,
            wake=Wake(kafka=kafka.notify, webhook=lambda: None),
        )
        kafka.hooks = pipeline.relay_hooks()
        kafka.render = RenderRelay(
            outbox, router, hooks=kafka.hooks, wake_kafka=lambda: None, wake_webhook=lambda: None
        )
        pipeline.attach(asyncio.get_running_loop())
        service = TemplateService(
            store,
            ready=ready.is_set,
            topic_prefix=settings.alerts_topic_prefix,
            ensure_topic=topics.ensure,
            egress=EGRESS,
            resolver=lambda _target: [PUBLIC_ADDRESS],
        )
        guard = build_guard(auth, CollectorRegistry(), "ds-notifier") if auth else None
        server = create_server(
            settings,
            [
                GrpcService(
                    "dataservice.notifier.v1.NotifierService",
                    NotifierServicer(pipeline, service, egress=EGRESS),
                    notifier_pb2_grpc.add_NotifierServiceServicer_to_server,
                )
            ],
            auth=guard.interceptor() if guard is not None else None,
        )
        await server.server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = notifier_pb2_grpc.NotifierServiceStub(channel)
                notifier = Notifier(stub, outbox, kafka, store, topics, ready, registry, pipeline)
                await asyncio.wait_for(body(notifier), 20)
        finally:
            await server.server.stop(0)
            outbox.close()

    asyncio.run(main())


async def refused(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """The status code, ErrorInfo reason and metadata a call fails with."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info(caught.value)
    assert info is not None, caught.value
    assert info.domain == DOMAIN
    return caught.value.code(), info.reason, dict(info.metadata)


def bad_field(name: str) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    return INVALID, "INVALID_FIELD", {"field": name}


# ---- ReportFault ----------------------------------------------------------------------------


def fault(**fields: Any) -> common_pb2.FaultEvent:
    """A valid report; ``fields`` override."""
    values: dict[str, Any] = {
        "type": common_pb2.FAULT_TYPE_COMMIT_FAILED,
        "state": common_pb2.FAULT_STATE_OPEN,
        "severity": common_pb2.SEVERITY_ERROR,
        "source_service": "sidecar",
        "source_instance": "sc-1",
        "group": "g",
        "topic": "t",
        "partitions": [0],
        "message": "commit failed",
    }
    values.update(fields)
    return common_pb2.FaultEvent(**values)


def report(event: common_pb2.FaultEvent) -> notifier_pb2.ReportFaultRequest:
    return notifier_pb2.ReportFaultRequest(event=event)
