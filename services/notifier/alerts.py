"""From a published fault event to the rendered alerts of every matching template.

Called when Kafka confirmed a fault event (so an alert never announces a fault that is
not on ``ds.faults``); the alerts it returns are queued in the outbox in the same
transaction that marks the fault delivered. Alert ids are derived from the fault id and
the template (UUIDv5), so the same fault never produces the same alert twice. A
template's send interval holds alerts back per (template, fault dedupe key); held alerts
come out of :meth:`AlertRouter.due` when the interval ends.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import structlog

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.notifier import templates
from services.notifier.metrics import NotifierMetrics
from services.notifier.outbox import KAFKA_LANE, WEBHOOK_LANE, OutboxItem
from services.runtime.faults import short_state, short_type

log = structlog.get_logger(__name__)

_ALERT_NAMESPACE = uuid.UUID("6f1c1f2e-0b8e-4a53-9d3c-6a1d2b7e4c10")


def alert_id(fault_id: str, template: notifier_pb2.AlertTemplate) -> str:
    return str(uuid.uuid5(_ALERT_NAMESPACE, f"{fault_id}/{template.caller}/{template.name}"))


class AlertRouter:
    def __init__(
        self,
        templates_of: Callable[[], list[notifier_pb2.AlertTemplate]],
        *,
        topic_prefix: str,
        metrics: NotifierMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._templates_of = templates_of
        self._prefix = topic_prefix
        self._metrics = metrics
        self._clock = clock
        self._limiter = templates.SendLimiter()
        self._lock = threading.Lock()  # the relay thread and the loop's timer both use it

    def alerts_for(self, event: common_pb2.FaultEvent) -> list[OutboxItem]:
        """The alerts a published event causes now (others may be held by intervals)."""
        now = self._clock()
        out: list[OutboxItem] = []
        for template in self._templates_of():
            if not templates.matches(template, event):
                continue
            if event.state == common_pb2.FAULT_STATE_RESOLVED and not template.resolved_template:
                continue
            interval = template.send_interval.ToNanoseconds() / 1e9
            key = (template.caller, template.name, event.dedupe_key)
            with self._lock:
                offer = self._limiter.offer(key, event, interval, now)
            if offer.rate_limited:
                self._metrics.alerts_rate_limited.labels(template.caller).inc()
            if offer.send:
                out.append(self._render(template, event))
        return out

    def due(self) -> list[OutboxItem]:
        """Held alerts whose interval ended and that change what the caller was told."""
        now = self._clock()
        with self._lock:
            ready = self._limiter.due(now)
        by_key = {(t.caller, t.name): t for t in self._templates_of()}
        out = []
        for (caller, name, _dedupe), event in ready:
            template = by_key.get((caller, name))
            if template is not None and (
                event.state != common_pb2.FAULT_STATE_RESOLVED or template.resolved_template
            ):
                out.append(self._render(template, event))
        return out

    def _render(
        self, template: notifier_pb2.AlertTemplate, event: common_pb2.FaultEvent
    ) -> OutboxItem:
        text = (
            template.resolved_template
            if event.state == common_pb2.FAULT_STATE_RESOLVED
            else template.open_template
        )
        try:
            body = templates.render(text, event)
        except Exception as exc:
            self._metrics.template_errors.labels(template.caller).inc()
            log.warning(
                "alert template failed to render",
                caller=template.caller,
                template=template.name,
                error=repr(exc),
            )
            body = (
                f"[template {template.caller}/{template.name} failed: {exc}] "
                f"{short_type(event.type)} {short_state(event.state)} group={event.group} "
                f"{event.message}"
            )
        route = template.WhichOneof("route")
        headers = (
            ("ds-id", alert_id(event.id, template)),
            ("ds-caller", template.caller),
            ("ds-template", template.name),
            ("ds-fault-id", event.id),
            ("ds-fault-type", short_type(event.type)),
            ("ds-fault-state", short_state(event.state)),
            ("content-type", "text/plain; charset=utf-8"),
        )
        self._metrics.alerts.labels(template.caller, route or "none").inc()
        if route == "webhook":
            return OutboxItem(
                id=alert_id(event.id, template),
                destination=template.webhook.url,
                value=body.encode(),
                key=event.group.encode(),
                headers=headers,
                lane=WEBHOOK_LANE,
                kind="alert",
            )
        return OutboxItem(
            id=alert_id(event.id, template),
            destination=templates.kafka_topic(template, self._prefix),
            value=body.encode(),
            key=event.group.encode(),
            headers=headers,
            lane=KAFKA_LANE,
            kind="alert",
        )
