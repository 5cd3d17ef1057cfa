"""The fault pipeline: a report → storm suppression → the durable outbox → (relay) →
``ds.faults`` → alerts, history and watchers.

* :meth:`FaultPipeline.report` (``ReportFault``, the lag evaluator, the probe): answer a
  re-report of a known id as before, suppress storms, and write the event to the outbox in
  one transaction with the record of the report. Kafka is not involved, so reports are
  accepted while Kafka is down; only an unwritable outbox refuses them.
* The relays call back (:meth:`FaultPipeline.relay_hooks`) when Kafka or a webhook
  confirmed items: a published fault then queues the alerts of the matching templates
  (``alerts.py``; rendered by the render relay, ``render_relay.py``) and enters the
  history that ``ListFaults`` and ``WatchFaults`` read. An item moved to the dead-letter
  table is counted and raises DEAD_LETTER.
* :meth:`FaultPipeline.tick` queues storm summaries and held alerts and sets the outbox
  gauge. The app runs it when :meth:`FaultPipeline.due` says something is (at most twice
  a second, at least every OUTBOX_GAUGE_SECONDS); a suppressed report or a published
  fault (whose alerts a send interval may hold) pokes :attr:`FaultPipeline.tick_wake`
  (``services/runtime/tick_wake.py``).

Requests are validated before they get here (``rpc.py``); the lag evaluator and the probe
build their events themselves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from dataservice.common.v1 import common_pb2
from dsclient.reasons import DsError, Reason
from services.notifier import fault_events as notifier_faults
from services.notifier.alerts import AlertRouter
from services.notifier.egress import redact
from services.notifier.event_codec import PROTOBUF_CONTENT_TYPE, decode_event, encode_event
from services.notifier.history import FaultHistory
from services.notifier.metrics import NotifierMetrics
from services.notifier.outbox import (
    KAFKA_LANE,
    RENDER_LANE,
    WEBHOOK_LANE,
    Outbox,
    OutboxItem,
    Received,
)
from services.notifier.relay import ID_HEADER, RelayHooks
from services.notifier.settings import NotifierSettings
from services.notifier.suppression import StormSuppressor
from services.runtime import faults
from services.runtime.tick_wake import TickWake

log = structlog.get_logger(__name__)

# ds_notifier_outbox_pending is refreshed this often (it was on every 0.5 s tick); an idle
# notifier ticks at this pace.
OUTBOX_GAUGE_SECONDS = 5.0
# The shortest time between two ticks: summaries and held alerts due within it go together.
TICK_GAP_SECONDS = 0.5


@dataclass(frozen=True)
class Wake:
    """Tells a lane's relay that items were queued, so it sends them now rather than on
    its next round."""

    kafka: Callable[[], None]
    webhook: Callable[[], None]
    render: Callable[[], None] = lambda: None


class FaultPipeline:
    def __init__(
        self,
        settings: NotifierSettings,
        *,
        outbox: Outbox,
        history: FaultHistory,
        router: AlertRouter,
        metrics: NotifierMetrics,
        wake: Wake,
        clock: Callable[[], float] = time.monotonic,
        instance: str = "",
    ) -> None:
        """``instance``: this notifier, named in the faults it raises itself. ``clock``
        must be the router's (both deadlines are compared in :meth:`due`)."""
        self._settings = settings
        self._instance = instance
        self._outbox = outbox
        self._history = history
        self._router = router
        self._metrics = metrics
        self._wake = wake
        self._clock = clock
        self._suppressor = StormSuppressor(self._window_for)
        # One report at a time: the known-id check, suppression and the outbox write of a
        # report must not interleave with another report's.
        self._report_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gauge_at = 0.0  # clock: when tick() next counts the outbox's lanes
        # The timer loop's sleep; poked (loop thread) when a deadline may have come nearer.
        self.tick_wake = TickWake(clock)
        self._hooks = RelayHooks(
            delivered=self._delivered,
            dead_letter=self._dead_letter,
            reconciled=lambda n: self._metrics.reconciled.inc(n),
        )

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop that owns the history: deliveries confirmed on the relay threads are
        handed over to it."""
        self._loop = loop

    # ---- reports --------------------------------------------------------------------------

    async def report(self, reported: common_pb2.FaultEvent) -> tuple[str, bool]:
        """Accept one valid report durably; returns (event id, suppressed). Raises
        :class:`DsError` ``SERVICE_NOT_READY`` when the outbox cannot be written."""
        async with self._report_lock:
            if reported.id:
                known = await asyncio.to_thread(self._outbox.received, reported.id)
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
            self._metrics.reports.labels(type_name, faults.short_state(event.state)).inc()
            admission = self._suppressor.admit(event, self._clock())
            answer = Received(event.id, not admission.publish)
            items: list[OutboxItem] = []
            if admission.publish:
                event.suppressed_count = admission.suppressed_count
                items.append(self._fault_item(event))
            else:
                self._metrics.suppressed.labels(type_name).inc()
                self.tick_wake.poke()  # its window's summary may now be the next deadline
            try:
                dead = await asyncio.to_thread(
                    self._outbox.append, items, received=(event.id, answer)
                )
            except Exception as exc:
                raise DsError(
                    Reason.SERVICE_NOT_READY, f"fault not stored: outbox not writable ({exc})"
                ) from exc
            self._hooks.report_dead_letters(dead)
        if items:
            self._wake.kafka()
        return answer.event_id, answer.suppressed

    def recent(self) -> list[common_pb2.FaultEvent]:
        """The latest published events, oldest first."""
        return self._history.recent()

    def watch(self) -> contextlib.AbstractContextManager[asyncio.Queue[common_pb2.FaultEvent]]:
        """A queue of every event published while the block runs."""
        return self._history.watch()

    def _window_for(self, fault_type: faults.FaultTypeValue) -> float:
        name = faults.short_type(fault_type)
        windows = self._settings.suppression_window_seconds
        if name in windows:
            return windows[name]
        if "*" in windows:
            return windows["*"]
        spec = faults.CATALOGUE.get(fault_type)
        return spec.window_seconds if spec is not None else faults.DEFAULT_WINDOW_SECONDS

    def _fault_item(self, event: common_pb2.FaultEvent) -> OutboxItem:
        value, content_type = encode_event(event, self._settings.fault_encoding)
        return OutboxItem(
            id=event.id,
            destination=self._settings.faults_topic,
            value=value,
            key=event.group.encode(),
            headers=((ID_HEADER, event.id), ("content-type", content_type)),
            lane=KAFKA_LANE,
            kind="fault",
        )

    # ---- timers ---------------------------------------------------------------------------

    def due(self) -> float:
        """The earliest time :meth:`tick` has something to do: a storm summary, a held
        alert, the outbox gauge (the pipeline's clock)."""
        return min(self._suppressor.next_due(), self._router.next_due(), self._gauge_at)

    async def tick(self) -> None:
        """Storm-suppression summaries and held alerts whose time came; the outbox gauge."""
        summaries = self._suppressor.due(self._clock())
        if summaries:
            items = [self._fault_item(e) for e in summaries]
            self._hooks.report_dead_letters(await asyncio.to_thread(self._outbox.append, items))
            self._wake.kafka()
        held = self._router.due()
        if held:
            self._hooks.report_dead_letters(await asyncio.to_thread(self._outbox.append, held))
            self._wake.render()
        now = self._clock()
        if now >= self._gauge_at:
            # The gauge every OUTBOX_GAUGE_SECONDS, the three lanes in one trip to a worker
            # thread: three SQLite counts on every 0.5 s tick were most of an idle
            # notifier's wake-ups of its own (issue 34).
            self._gauge_at = now + OUTBOX_GAUGE_SECONDS
            counts = await asyncio.to_thread(self._count_lanes)
            for lane, count in counts.items():
                self._metrics.outbox_pending.labels(lane).set(count)

    def _count_lanes(self) -> dict[str, int]:
        return {lane: self._outbox.count(lane) for lane in (KAFKA_LANE, WEBHOOK_LANE, RENDER_LANE)}

    # ---- delivery (relay threads) -------------------------------------------------------

    def relay_hooks(self) -> RelayHooks:
        return self._hooks

    def _delivered(self, items: Sequence[OutboxItem]) -> list[OutboxItem]:
        follow_ups: list[OutboxItem] = []
        published: list[common_pb2.FaultEvent] = []
        for item in items:
            if item.kind != "fault":
                route = "webhook" if item.lane == WEBHOOK_LANE else "kafka"
                self._metrics.alerts_delivered.labels(route).inc()
                continue
            content_type = dict(item.headers).get("content-type", PROTOBUF_CONTENT_TYPE)
            event = decode_event(item.value, content_type)
            published.append(event)
            self._metrics.published.labels(
                faults.short_type(event.type), faults.short_state(event.state)
            ).inc()
            follow_ups.extend(self._router.alerts_for(event))
        if published:
            self._outbox.add_history([(e.id, e.SerializeToString()) for e in published])
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._announce, published)
        if follow_ups:
            self._wake.render()
        return follow_ups

    def _dead_letter(self, items: Sequence[OutboxItem], why: str) -> None:
        """Items went to the dead-letter table together (one, or a webhook destination's
        waiting items in bulk): count each, log, raise one DEAD_LETTER for them — but not
        for a DEAD_LETTER event, nor for an alert of one: a faults topic, or a webhook,
        that refuses everything must not feed itself (a DEAD_LETTER fault alerts the
        templates matching it, whose alerts may be refused in turn)."""
        if not items:
            return
        for item in items:
            self._metrics.dead_letters.labels(item.kind).inc()
        first = items[0]
        destination = redact(first.destination) if first.lane == WEBHOOK_LANE else first.destination
        log.error(
            "outbox items moved to the dead-letter table",
            id=first.id,
            count=len(items),
            kind=first.kind,
            destination=destination,
            error=why,
        )
        dead_letter_name = faults.short_type(common_pb2.FAULT_TYPE_DEAD_LETTER)
        to_report = [
            item
            for item in items
            if not (item.kind == "fault" and self._is_dead_letter_fault(item))
            and not (
                item.kind == "alert" and dict(item.headers).get("ds-fault-type") == dead_letter_name
            )
        ]
        if to_report:
            for event in notifier_faults.dead_letter(to_report, why, self._instance):
                self.report_threadsafe(event)

    @staticmethod
    def _is_dead_letter_fault(item: OutboxItem) -> bool:
        content_type = dict(item.headers).get("content-type", PROTOBUF_CONTENT_TYPE)
        try:
            event = decode_event(item.value, content_type)
        except Exception:
            return False
        return event.type == common_pb2.FAULT_TYPE_DEAD_LETTER

    def report_threadsafe(self, event: common_pb2.FaultEvent) -> None:
        """Report from another thread (a relay's); a failure is logged, not raised."""
        if self._loop is None:
            log.warning("fault not reported: the pipeline has no loop yet", type=event.type)
            return
        future = asyncio.run_coroutine_threadsafe(self.report(event), self._loop)

        def done(f: concurrent.futures.Future[tuple[str, bool]]) -> None:
            if (error := f.exception()) is not None:
                log.warning("own fault not reported", error=repr(error))

        future.add_done_callback(done)

    def _announce(self, events: list[common_pb2.FaultEvent]) -> None:
        self._history.add(events)
        self.tick_wake.poke()  # a send interval may hold some of their alerts
        for event in events:
            log.info(
                "fault published",
                type=faults.short_type(event.type),
                state=faults.short_state(event.state),
                group=event.group,
                id=event.id,
                suppressed_count=event.suppressed_count,
            )
