"""The notifier's wiring and lifecycle: builds the fault pipeline, the template service and
the background work, hands the narrow objects to the servicer, starts and stops it all.

* Reports (``ReportFault``, the lag evaluator, the probe) go through the fault pipeline
  (``pipeline.py``): storm suppression, then the SQLite outbox.
* The Kafka relay publishes the outbox in order to ``ds.faults`` and the pipeline queues
  the alerts of matching templates (``alerts.py``); the webhook relay POSTs webhook alerts.
* Alert templates live in a compacted topic (``template_store.py``), written through the
  template service (``template_service.py``).
* The lag monitor evaluates every group and reports LAG_* faults through the pipeline.
* The end-to-end probe (optional, ``probe.enabled``) produces probe records and consumes
  them through the mesh; lost probes raise PROBE_LOST through the pipeline.

Kafka is needed once at start (topics, templates); later outages only delay publishing,
so the notifier stays SERVING while its outbox is writable.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

import structlog
from confluent_kafka import Consumer, Producer
from prometheus_client import CollectorRegistry, ProcessCollector

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from services.notifier import fault_events as notifier_faults
from services.notifier import template_store
from services.notifier.alerts import AlertRouter
from services.notifier.egress import EgressPolicy
from services.notifier.history import FaultHistory
from services.notifier.lag_monitor import LagMonitor
from services.notifier.lag_monitor import fault_event as lag_fault_event
from services.notifier.metrics import NotifierMetrics, ProbeMetrics
from services.notifier.outbox import KAFKA_LANE, Outbox
from services.notifier.pipeline import (
    OUTBOX_GAUGE_SECONDS,
    TICK_GAP_SECONDS,
    FaultPipeline,
    Wake,
)
from services.notifier.probe import TICK_SECONDS, Prober, new_instance_id
from services.notifier.probe import fault_event as probe_fault_event
from services.notifier.relay import KafkaRelay, WebhookRelay
from services.notifier.render_relay import RenderRelay
from services.notifier.render_worker import RenderLimits, RenderWorker
from services.notifier.rpc import NotifierServicer
from services.notifier.settings import NotifierSettings
from services.notifier.template_service import TemplateService
from services.runtime import offsets_topic
from services.runtime.grpcserver import GrpcServer, GrpcService
from services.runtime.http import Route
from services.runtime.kafka import KafkaProbe, new_admin, new_producer
from services.runtime.lifecycle import Dependency
from services.runtime.tasks import TaskSet
from services.runtime.tick_wake import next_tick
from services.runtime.topics import TopicSpec, ensure_topic

log = structlog.get_logger(__name__)


class _StartupKafka:
    """Kafka matters for health only until the notifier has started (topics created,
    templates loaded). After that an outage does not make it NOT_SERVING: reports are
    accepted into the outbox and published when Kafka is back."""

    name = "kafka"

    def __init__(self, probe: KafkaProbe, started: threading.Event) -> None:
        self._probe = probe
        self._started = started

    async def check(self) -> None:
        if not self._started.is_set():
            await self._probe.check()


class _OutboxProbe:
    name = "outbox"

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    async def check(self) -> None:
        try:
            await asyncio.to_thread(self._outbox.count, KAFKA_LANE)
        except Exception as exc:
            raise ConnectionError(f"outbox {self._outbox.path} unusable: {exc}") from exc


class NotifierApp:
    name = "ds-notifier"

    def __init__(self, settings: NotifierSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.metrics = NotifierMetrics(self.registry)
        self.instance = socket.gethostname()
        self.outbox = Outbox(
            settings.resolved_outbox_path(),
            history_max=settings.recent_faults,
            dead_letters_max=settings.dead_letters_max,
            max_pending_per_destination=settings.webhook_max_pending,
        )
        published = self.outbox.history(settings.recent_faults)
        history = FaultHistory(
            map(common_pb2.FaultEvent.FromString, published), size=settings.recent_faults
        )
        self._admin = new_admin(settings, client_id="ds-notifier")
        self._probe = KafkaProbe(settings, client_id="ds-notifier", admin=self._admin)
        self._started = threading.Event()
        self.template_store = template_store.TemplateStore(
            settings,
            settings.templates_topic,
            admin=self._admin,
            replication=settings.faults_topic_replication,
        )
        alerts = settings.alerts
        self.egress = EgressPolicy(alerts.webhook_egress)
        self.renderer = RenderWorker(
            RenderLimits(
                timeout_seconds=alerts.render_timeout_seconds,
                max_bytes=alerts.render_max_bytes,
                memory_bytes=alerts.render_memory_bytes,
            )
        )
        self.router = AlertRouter(
            self.template_store.all,
            topic_prefix=settings.alerts_topic_prefix,
            metrics=self.metrics,
            clock=time.monotonic,
            egress=self.egress,
            renderer=self.renderer,
            on_failed=self._template_failed,
        )
        self.templates = TemplateService(
            self.template_store,
            ready=self._started.is_set,
            topic_prefix=settings.alerts_topic_prefix,
            ensure_topic=self._ensure_alerts_topic,
            egress=self.egress,
            max_per_caller=alerts.max_templates_per_caller,
            trial=self.router.trial,
            on_put=self._template_put,
        )
        # The pipeline wakes the relays; the relays hand what they delivered back to it.
        self.pipeline = FaultPipeline(
            settings,
            outbox=self.outbox,
            history=history,
            router=self.router,
            metrics=self.metrics,
            wake=Wake(
                kafka=lambda: self.kafka_relay.notify(),
                webhook=lambda: self.webhook_relay.notify(),
                render=lambda: self.render_relay.notify(),
            ),
            instance=self.instance,
        )
        hooks = self.pipeline.relay_hooks()
        self.kafka_relay = KafkaRelay(
            self.outbox,
            new_producer=self._relay_producer,
            new_consumer=lambda: self._consumer("ds-notifier-reconcile"),
            hooks=hooks,
            ready=self._started,
        )
        self.webhook_relay = WebhookRelay(
            self.outbox,
            hooks=hooks,
            egress=self.egress,
            timeout=settings.webhook_timeout_seconds,
            max_attempts=settings.webhook_max_attempts,
            max_age=settings.webhook_max_age_seconds,
        )
        self.render_relay = RenderRelay(
            self.outbox,
            self.router,
            hooks=hooks,
            wake_kafka=self.kafka_relay.notify,
            wake_webhook=self.webhook_relay.notify,
        )
        self.lag = LagMonitor(settings.lag, self._admin, self._lag_consumer)
        self.prober: Prober | None = None
        if settings.probe.enabled:
            self.prober = Prober(
                settings.probe,
                instance=new_instance_id(self.instance),
                admin=self._admin,
                producer=self._probe_producer(),
                metrics=ProbeMetrics(self.registry),
                consul=settings.consul,
                connection=settings.connection,
            )
        self._tasks = TaskSet("notifier task failed")
        self._threads_started = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- Kafka clients ------------------------------------------------------------------

    def _relay_producer(self) -> Producer:
        # Retry forever while Kafka is down; idempotence keeps order and drops duplicates.
        return new_producer(
            self.settings,
            client_id="ds-notifier-outbox",
            overrides={"message.timeout.ms": 0, "max.in.flight.requests.per.connection": 5},
        )

    def _probe_producer(self) -> Producer:
        # Unbatched (a probe's round trip should not include linger time); a probe the
        # producer cannot deliver within the probe timeout is reported failed, not kept.
        return new_producer(
            self.settings,
            client_id="ds-notifier-probe",
            overrides={
                "linger.ms": 0,
                "message.timeout.ms": max(1000, int(self.settings.probe.timeout_seconds * 1000)),
            },
        )

    def _lag_consumer(self) -> Consumer:
        """The lag monitor's reader of ``__consumer_offsets``: fetches batched by the broker
        (offsets_topic.reader_overrides()), unless the passthrough settings say otherwise."""
        return self._consumer("ds-notifier-lag", offsets_topic.reader_overrides())

    def _consumer(self, client_id: str, defaults: Mapping[str, object] | None = None) -> Consumer:
        config = {
            "bootstrap.servers": self.settings.bootstrap,
            "client.id": client_id,
            "group.id": f"{client_id}-{uuid.uuid4().hex[:8]}",  # never joins, never commits
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "isolation.level": "read_committed",
            "log_level": 3,
            **(defaults or {}),
        }
        config.update(self.settings.kafka)
        return Consumer(config)

    def _ensure_alerts_topic(self, topic: str) -> None:
        spec = TopicSpec(
            topic, self.settings.alerts_topic_partitions, self.settings.faults_topic_replication
        )
        ensure_topic(self._admin, spec)

    # ---- Service protocol -------------------------------------------------------------

    def grpc_services(self) -> Sequence[GrpcService]:
        return [
            GrpcService(
                "dataservice.notifier.v1.NotifierService",
                NotifierServicer(
                    self.pipeline,
                    self.templates,
                    limits=self.settings.report_limits,
                    topic_prefix=self.settings.alerts_topic_prefix,
                    egress=self.egress,
                ),
                notifier_pb2_grpc.add_NotifierServiceServicer_to_server,
            )
        ]

    def dependencies(self) -> Sequence[Dependency]:
        return [_StartupKafka(self._probe, self._started), _OutboxProbe(self.outbox)]

    def http_routes(self) -> Mapping[str, Route]:
        return {}

    def instance_meta(self) -> Mapping[str, str]:
        return {}

    async def on_ready(self, server: GrpcServer) -> None:
        """Kafka is reachable: create topics, load templates, start publishing (idempotent:
        the lifecycle retries this on failure)."""
        self._loop = asyncio.get_running_loop()
        self.pipeline.attach(self._loop)
        faults_topic = TopicSpec(
            self.settings.faults_topic,
            self.settings.faults_topic_partitions,
            self.settings.faults_topic_replication,
        )
        await asyncio.to_thread(ensure_topic, self._admin, faults_topic)
        if self.prober is not None:
            await asyncio.to_thread(self.prober.setup)
        if not self._threads_started:
            await asyncio.to_thread(self.template_store.start)
            self.kafka_relay.start()
            self.webhook_relay.start()
            self.render_relay.start()
            if self.settings.lag.enabled:
                self.lag.start()
                self._tasks.spawn(self._lag_poll_loop(), "lag-poll")
                self._tasks.spawn(self._lag_evaluate_loop(), "lag-evaluate")
            if self.prober is not None:
                self.prober.start()
                self._tasks.spawn(self._probe_loop(self.prober), "probe")
            self._tasks.spawn(self._timer_loop(), "timers")
            self._threads_started = True
        self._started.set()
        self.kafka_relay.notify()

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        await self._tasks.cancel_all()
        self.lag.stop()
        if self.prober is not None:
            await asyncio.to_thread(self.prober.stop)
        await asyncio.to_thread(self.template_store.stop)
        await asyncio.to_thread(self.kafka_relay.stop, 10.0)
        await asyncio.to_thread(self.webhook_relay.stop)
        await asyncio.to_thread(self.render_relay.stop)
        await asyncio.to_thread(self.renderer.close)
        pending = self.outbox.count(KAFKA_LANE)
        if pending:
            log.warning("stopping with fault events still queued in the outbox", count=pending)
        self.outbox.close()

    # ---- alert templates that fail ---------------------------------------------------------

    def _template_failed(self, template: notifier_pb2.AlertTemplate, why: str) -> None:
        """The router disabled ``template`` (render relay thread): store it disabled and
        raise TEMPLATE_FAILED, on the loop."""
        loop = self._loop
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._disable(template, why), loop)

    async def _disable(self, template: notifier_pb2.AlertTemplate, why: str) -> None:
        try:
            stored = await self.templates.disable(template.caller, template.name, why)
        except Exception as exc:  # Kafka down: the router keeps it disabled here meanwhile
            log.warning("disabled template not stored", template=template.name, error=repr(exc))
            stored = True
        if stored:
            event = notifier_faults.template_failed(
                template.caller, template.name, why, self.instance
            )
            await self.pipeline.report(event)

    async def _template_put(self, template: notifier_pb2.AlertTemplate, was_disabled: bool) -> None:
        self.router.enable(template.caller, template.name)
        if was_disabled:
            event = notifier_faults.template_failed(
                template.caller, template.name, "", self.instance, resolved=True
            )
            await self.pipeline.report(event)

    # ---- background loops -----------------------------------------------------------------

    async def _timer_loop(self) -> None:
        """Storm-suppression summaries, held alerts, the outbox gauge: when the pipeline
        says one is due or a report pokes (tick_wake.py), at most every TICK_GAP_SECONDS."""
        wake = self.pipeline.tick_wake
        while True:
            ticked = wake.clock()
            try:
                await self.pipeline.tick()
            except Exception:
                log.exception("notifier timer failed")
            until = next_tick(
                ticked, self.pipeline.due(), TICK_GAP_SECONDS, longest=OUTBOX_GAUGE_SECONDS
            )
            await wake.sleep(ticked, until, TICK_GAP_SECONDS)

    async def _lag_poll_loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.lag.poll)
            except Exception as exc:
                self.metrics.lag_poll_errors.inc()
                log.warning("high-watermark poll failed", error=repr(exc))
            await asyncio.sleep(self.settings.lag.poll_seconds)

    async def _lag_evaluate_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lag.evaluate_seconds)
            try:
                await self.evaluate_lag()
            except Exception:
                log.exception("lag evaluation failed")

    async def evaluate_lag(self) -> None:
        groups = await asyncio.to_thread(self.lag.evaluate)
        self.metrics.set_lag(groups)
        self.metrics.lag_evaluations.inc()
        for transition in self.lag.transitions(groups):
            await self.pipeline.report(lag_fault_event(transition, self.instance))

    async def _probe_loop(self, prober: Prober) -> None:
        while True:
            try:
                change = await asyncio.to_thread(prober.tick)
                if change is not None:
                    await self.pipeline.report(
                        probe_fault_event(change, prober.settings, self.instance)
                    )
            except Exception as exc:  # Kafka unreachable, say: the next tick tries again
                log.warning("probe round failed", error=repr(exc))
            await asyncio.sleep(TICK_SECONDS)
