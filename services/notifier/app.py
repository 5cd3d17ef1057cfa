"""Notifier wiring: reports → storm suppression → durable outbox → Kafka (and alerts).

* ``ReportFault`` (and the lag evaluator) → :meth:`NotifierApp.report`: validate, answer a
  re-report of a known id as before, suppress storms, and write the event to the SQLite
  outbox in one transaction with the record of the report. Kafka is not involved, so
  reports are accepted while Kafka is down.
* The Kafka relay publishes the outbox in order to ``ds.faults`` (keyed by group,
  protobuf or JSON) and, for each confirmed fault, queues the rendered alerts of matching
  templates (``alerts.py``); the webhook relay POSTs webhook alerts.
* The lag monitor evaluates every group and reports LAG_* faults through the same path.
* The end-to-end probe (optional, ``probe.enabled``) produces probe records and consumes
  them through the mesh; lost probes raise PROBE_LOST through the same path.

Kafka is needed once at start (topics, templates); later outages only delay publishing,
so the notifier stays SERVING while its outbox is writable.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence

import structlog
from confluent_kafka import Consumer, Producer
from prometheus_client import CollectorRegistry, ProcessCollector

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from services.notifier import faults, template_store, templates
from services.notifier.alerts import AlertRouter
from services.notifier.event_codec import PROTOBUF_CONTENT_TYPE, decode_event, encode_event
from services.notifier.lag_monitor import LagMonitor
from services.notifier.lag_monitor import fault_event as lag_fault_event
from services.notifier.metrics import NotifierMetrics, ProbeMetrics
from services.notifier.outbox import KAFKA_LANE, WEBHOOK_LANE, Outbox, OutboxItem, Received
from services.notifier.probe import TICK_SECONDS, Prober, fault_event, new_instance_id
from services.notifier.relay import ID_HEADER, KafkaRelay, RelayHooks, WebhookRelay
from services.notifier.rpc import NotifierServicer
from services.notifier.settings import NotifierSettings
from services.notifier.suppression import StormSuppressor
from services.runtime.errors import DsError, Reason
from services.runtime.grpcserver import GrpcServer, GrpcService
from services.runtime.http import Route
from services.runtime.kafka import KafkaProbe, new_admin, new_producer
from services.runtime.lifecycle import Dependency

log = structlog.get_logger(__name__)

_IDEMPOTENCY_KEYS = 10_000


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
        self.outbox = Outbox(settings.resolved_outbox_path(), history_max=settings.recent_faults)
        self.recent: deque[common_pb2.FaultEvent] = deque(maxlen=settings.recent_faults)
        for raw in self.outbox.history(settings.recent_faults):
            self.recent.append(common_pb2.FaultEvent.FromString(raw))
        self.watchers: set[asyncio.Queue[common_pb2.FaultEvent]] = set()
        self.suppressor = StormSuppressor(self._window_for)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._report_lock = asyncio.Lock()
        self._admin = new_admin(settings, client_id="ds-notifier")
        self._probe = KafkaProbe(settings, client_id="ds-notifier", admin=self._admin)
        self._started = threading.Event()
        self._templates_producer = new_producer(settings, client_id="ds-notifier-templates")
        self.templates = template_store.TemplateStore(
            settings.templates_topic,
            admin=self._admin,
            producer=self._templates_producer,
            new_consumer=lambda: self._consumer("ds-notifier-templates"),
            replication=settings.faults_topic_replication,
        )
        self.router = AlertRouter(
            self.templates.all,
            topic_prefix=settings.alerts_topic_prefix,
            metrics=self.metrics,
            clock=time.monotonic,
        )
        hooks = RelayHooks(
            delivered=self._on_delivered,
            dead_letter=self._on_dead_letter,
            reconciled=lambda n: self.metrics.reconciled.inc(n),
        )
        self.kafka_relay = KafkaRelay(
            self.outbox,
            new_producer=self._relay_producer,
            new_consumer=lambda: self._consumer("ds-notifier-reconcile"),
            hooks=hooks,
            ready=self._started,
        )
        self.webhook_relay = WebhookRelay(
            self.outbox, hooks=hooks, timeout=settings.webhook_timeout_seconds
        )
        self.lag = LagMonitor(settings.lag, self._admin, lambda: self._consumer("ds-notifier-lag"))
        self.prober: Prober | None = None
        if settings.probe.enabled:
            self.prober = Prober(
                settings.probe,
                instance=new_instance_id(self.instance),
                admin=self._admin,
                producer=self._probe_producer(),
                metrics=ProbeMetrics(self.registry),
                consul=settings.consul,
            )
        self._idempotent: OrderedDict[str, notifier_pb2.AlertTemplate | None] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._threads_started = False

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

    def _consumer(self, client_id: str) -> Consumer:
        config = {
            "bootstrap.servers": self.settings.bootstrap,
            "client.id": client_id,
            "group.id": f"{client_id}-{uuid.uuid4().hex[:8]}",  # never joins, never commits
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "isolation.level": "read_committed",
            "log_level": 3,
        }
        config.update(self.settings.kafka)
        return Consumer(config)

    # ---- Service protocol -------------------------------------------------------------

    def grpc_services(self) -> Sequence[GrpcService]:
        return [
            GrpcService(
                "dataservice.notifier.v1.NotifierService",
                NotifierServicer(self),
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
        await asyncio.to_thread(
            template_store.ensure_topic,
            self._admin,
            self.settings.faults_topic,
            self.settings.faults_topic_partitions,
            self.settings.faults_topic_replication,
            {},
        )
        if self.prober is not None:
            await asyncio.to_thread(self.prober.setup)
        if not self._threads_started:
            await asyncio.to_thread(self.templates.start)
            self.kafka_relay.start()
            self.webhook_relay.start()
            if self.settings.lag.enabled:
                self.lag.start()
                self._spawn(self._lag_poll_loop(), "lag-poll")
                self._spawn(self._lag_evaluate_loop(), "lag-evaluate")
            if self.prober is not None:
                self.prober.start()
                self._spawn(self._probe_loop(self.prober), "probe")
            self._spawn(self._timer_loop(), "timers")
            self._threads_started = True
        self._started.set()
        self.kafka_relay.notify()

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))  # type: ignore[arg-type]

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.lag.stop()
        if self.prober is not None:
            await asyncio.to_thread(self.prober.stop)
        self.templates.stop()
        await asyncio.to_thread(self.kafka_relay.stop, 10.0)
        await asyncio.to_thread(self.webhook_relay.stop)
        await asyncio.to_thread(self._templates_producer.flush, 5)
        pending = self.outbox.count(KAFKA_LANE)
        if pending:
            log.warning("stopping with fault events still queued in the outbox", count=pending)
        self.outbox.close()

    # ---- reports --------------------------------------------------------------------------

    def _window_for(self, fault_type: faults.FaultTypeValue) -> float:
        name = faults.short_type(fault_type)
        windows = self.settings.suppression_window_seconds
        if name in windows:
            return windows[name]
        if "*" in windows:
            return windows["*"]
        spec = faults.CATALOGUE.get(fault_type)
        return spec.window_seconds if spec is not None else faults.DEFAULT_WINDOW_SECONDS

    async def report(self, reported: common_pb2.FaultEvent) -> tuple[str, bool]:
        """Accept one valid report durably; returns (event id, suppressed)."""
        async with self._report_lock:
            if reported.id:
                known = await asyncio.to_thread(self.outbox.received, reported.id)
                if known is not None:
                    return known.event_id, known.suppressed
            event = common_pb2.FaultEvent()
            event.CopyFrom(reported)
            if not event.id:
                event.id = str(uuid.uuid4())
            if not event.HasField("detected_at"):
                event.detected_at.FromNanoseconds(time.time_ns())
            if not event.dedupe_key:
                event.dedupe_key = faults.default_dedupe_key(event)
            type_name = faults.short_type(event.type)
            self.metrics.reports.labels(type_name, faults.short_state(event.state)).inc()
            admission = self.suppressor.admit(event, time.monotonic())
            answer = Received(event.id, not admission.publish)
            items: list[OutboxItem] = []
            if admission.publish:
                event.suppressed_count = admission.suppressed_count
                items.append(self._fault_item(event))
            else:
                self.metrics.suppressed.labels(type_name).inc()
            try:
                await asyncio.to_thread(self.outbox.append, items, received=(event.id, answer))
            except Exception as exc:
                raise DsError(
                    Reason.SERVICE_NOT_READY, f"fault not stored: outbox not writable ({exc})"
                ) from exc
        if items:
            self.kafka_relay.notify()
        return answer.event_id, answer.suppressed

    def _fault_item(self, event: common_pb2.FaultEvent) -> OutboxItem:
        value, content_type = encode_event(event, self.settings.fault_encoding)
        return OutboxItem(
            id=event.id,
            destination=self.settings.faults_topic,
            value=value,
            key=event.group.encode(),
            headers=((ID_HEADER, event.id), ("content-type", content_type)),
            lane=KAFKA_LANE,
            kind="fault",
        )

    async def _queue_summaries(self) -> None:
        summaries = self.suppressor.due(time.monotonic())
        if summaries:
            items = [self._fault_item(e) for e in summaries]
            await asyncio.to_thread(self.outbox.append, items)
            self.kafka_relay.notify()

    # ---- delivery (relay threads) -------------------------------------------------------

    def _on_delivered(self, items: Sequence[OutboxItem]) -> list[OutboxItem]:
        follow_ups: list[OutboxItem] = []
        published: list[common_pb2.FaultEvent] = []
        for item in items:
            if item.kind != "fault":
                route = "webhook" if item.lane == WEBHOOK_LANE else "kafka"
                self.metrics.alerts_delivered.labels(route).inc()
                continue
            content_type = dict(item.headers).get("content-type", PROTOBUF_CONTENT_TYPE)
            event = decode_event(item.value, content_type)
            published.append(event)
            self.metrics.published.labels(
                faults.short_type(event.type), faults.short_state(event.state)
            ).inc()
            follow_ups.extend(self.router.alerts_for(event))
        if published:
            self.outbox.add_history([(e.id, e.SerializeToString()) for e in published])
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._fan_out, published)
        if any(i.lane == WEBHOOK_LANE for i in follow_ups):
            self.webhook_relay.notify()
        return follow_ups

    def _on_dead_letter(self, item: OutboxItem, why: str) -> None:
        self.metrics.dead_letters.labels(item.kind).inc()
        log.error(
            "outbox item dropped: permanent delivery error",
            id=item.id,
            kind=item.kind,
            destination=item.destination,
            error=why,
        )

    def _fan_out(self, events: list[common_pb2.FaultEvent]) -> None:
        for event in events:
            self.recent.append(event)
            for queue in list(self.watchers):
                if not queue.full():
                    queue.put_nowait(event)
            log.info(
                "fault published",
                type=faults.short_type(event.type),
                state=faults.short_state(event.state),
                group=event.group,
                id=event.id,
                suppressed_count=event.suppressed_count,
            )

    # ---- timers ---------------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        """Storm-suppression summaries, held alerts, the outbox gauge."""
        while True:
            await asyncio.sleep(0.5)
            try:
                await self._queue_summaries()
                held = self.router.due()
                if held:
                    await asyncio.to_thread(self.outbox.append, held)
                    self.kafka_relay.notify()
                    self.webhook_relay.notify()
                for lane in (KAFKA_LANE, WEBHOOK_LANE):
                    count = await asyncio.to_thread(self.outbox.count, lane)
                    self.metrics.outbox_pending.labels(lane).set(count)
            except Exception:
                log.exception("notifier timer failed")

    # ---- lag ------------------------------------------------------------------------------

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
            await self.report(lag_fault_event(transition, self.instance))

    # ---- end-to-end probe -------------------------------------------------------------------

    async def _probe_loop(self, prober: Prober) -> None:
        while True:
            try:
                change = await asyncio.to_thread(prober.tick)
                if change is not None:
                    await self.report(fault_event(change, prober.settings, self.instance))
            except Exception as exc:  # Kafka unreachable, say: the next tick tries again
                log.warning("probe round failed", error=repr(exc))
            await asyncio.sleep(TICK_SECONDS)

    # ---- alert templates ------------------------------------------------------------------

    def _require_templates(self) -> None:
        if not self._started.is_set():
            raise DsError(
                Reason.SERVICE_NOT_READY, "alert templates are not loaded yet (Kafka unreachable)"
            )

    def _remember(self, request_id: str, answer: notifier_pb2.AlertTemplate | None) -> None:
        if request_id:
            self._idempotent[request_id] = answer
            while len(self._idempotent) > _IDEMPOTENCY_KEYS:
                self._idempotent.popitem(last=False)

    async def put_template(
        self, template: notifier_pb2.AlertTemplate, request_id: str
    ) -> notifier_pb2.AlertTemplate:
        self._require_templates()
        if request_id in self._idempotent and (done := self._idempotent[request_id]) is not None:
            return done
        stored = notifier_pb2.AlertTemplate()
        stored.CopyFrom(template)
        if stored.WhichOneof("route") == "kafka":
            stored.kafka.topic = templates.kafka_topic(stored, self.settings.alerts_topic_prefix)
            await self._kafka_call(
                template_store.ensure_topic,
                self._admin,
                stored.kafka.topic,
                self.settings.alerts_topic_partitions,
                self.settings.faults_topic_replication,
                {},
            )
        await self._kafka_await(self.templates.put(stored))
        self._remember(request_id, stored)
        log.info("alert template stored", caller=stored.caller, template=stored.name)
        return stored

    def list_templates(self, caller: str) -> list[notifier_pb2.AlertTemplate]:
        self._require_templates()
        return [t for t in self.templates.all() if not caller or t.caller == caller]

    async def delete_template(self, caller: str, name: str, request_id: str) -> None:
        self._require_templates()
        if request_id and request_id in self._idempotent:
            return
        if self.templates.get(caller, name) is None:
            raise DsError(
                Reason.ALERT_TEMPLATE_NOT_FOUND,
                f"no alert template {name!r} of caller {caller!r}",
                metadata={"caller": caller, "name": name},
            )
        await self._kafka_await(self.templates.delete(caller, name))
        self._remember(request_id, None)
        log.info("alert template deleted", caller=caller, template=name)

    async def _kafka_call(self, fn: Callable[..., None], *args: object) -> None:
        await self._kafka_await(asyncio.to_thread(fn, *args))

    @staticmethod
    async def _kafka_await(awaitable: Awaitable[None]) -> None:
        try:
            await awaitable
        except DsError:
            raise
        except Exception as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, f"alert template not stored: {exc!r}") from exc
