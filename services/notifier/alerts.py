"""From a published fault event to the rendered alerts of every matching template.

Called when Kafka confirmed a fault event (so an alert never announces a fault that is
not on ``ds.faults``): :meth:`AlertRouter.alerts_for` returns *render jobs* (outbox lane
``render``: the template's key and the event), queued in the same transaction that marks
the fault delivered. Nothing is rendered on the Kafka relay's thread: the render relay
(``render_relay.py``) takes each job to :meth:`AlertRouter.render`, which renders it in
the render worker (a time, output-size and memory limit) and returns the alert for the
template's route. Alert ids are derived from the fault id and the template (UUIDv5), so
the same fault never produces the same alert twice. A template's send interval holds
alerts back per (template, fault dedupe key); held alerts come out of
:meth:`AlertRouter.due` when the interval ends.

A template that passes a rendering limit, or whose route is no longer allowed (it was
stored before the rules, or the egress allow-list changed), is disabled at once here and
reported through ``on_failed`` (the app stores it disabled and raises TEMPLATE_FAILED); a
disabled template alerts no more until it is put again.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.notifier import templates
from services.notifier.egress import EgressPolicy
from services.notifier.metrics import NotifierMetrics
from services.notifier.outbox import KAFKA_LANE, RENDER_LANE, WEBHOOK_LANE, OutboxItem
from services.notifier.render_worker import LimitExceeded, TemplateError
from services.notifier.sandbox import OutputTooLarge, render_limited
from services.runtime.faults import short_state, short_type

log = structlog.get_logger(__name__)

_ALERT_NAMESPACE = uuid.UUID("6f1c1f2e-0b8e-4a53-9d3c-6a1d2b7e4c10")
TemplateKey = tuple[str, str]


def alert_id(fault_id: str, template: notifier_pb2.AlertTemplate) -> str:
    return str(uuid.uuid5(_ALERT_NAMESPACE, f"{fault_id}/{template.caller}/{template.name}"))


class Renderer(Protocol):
    """Renders a template text (``render_worker.RenderWorker``): raises LimitExceeded past
    a limit, TemplateError for the template's own error."""

    def render(self, text: str, variables: Mapping[str, Any]) -> str: ...


class InProcessRenderer:
    """The sandbox and its output limit in this process, without a time or memory limit:
    for tools and tests, never for the notifier's alerts."""

    def render(self, text: str, variables: Mapping[str, Any]) -> str:
        try:
            return render_limited(templates._ENV, text, variables)
        except OutputTooLarge as exc:
            raise LimitExceeded("size", str(exc)) from None
        except Exception as exc:
            raise TemplateError(f"{type(exc).__name__}: {exc}") from None


class AlertRouter:
    def __init__(
        self,
        templates_of: Callable[[], list[notifier_pb2.AlertTemplate]],
        *,
        topic_prefix: str,
        metrics: NotifierMetrics,
        clock: Callable[[], float],
        egress: EgressPolicy | None = None,
        renderer: Renderer | None = None,
        on_failed: Callable[[notifier_pb2.AlertTemplate, str], None] = lambda _t, _w: None,
    ) -> None:
        """``egress``: where webhooks may go (None: not checked here). ``on_failed(t,
        why)``: ``t`` was just disabled (called on the render relay's thread)."""
        self._templates_of = templates_of
        self._prefix = topic_prefix
        self._metrics = metrics
        self._clock = clock
        self._egress = egress
        self._renderer: Renderer = renderer or InProcessRenderer()
        self._on_failed = on_failed
        self._limiter = templates.SendLimiter()
        self._lock = threading.Lock()  # the relay threads and the loop's timer use it
        # Disabled here, until the store shows the template disabled (or it is put again).
        self._disabled: set[TemplateKey] = set()

    # ---- which alerts (the Kafka relay's thread, the timer) -----------------------------

    def alerts_for(self, event: common_pb2.FaultEvent) -> list[OutboxItem]:
        """The render jobs a published event causes now (others may be held back by
        send intervals)."""
        now = self._clock()
        out: list[OutboxItem] = []
        for template in self._enabled():
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
                out.append(self._job(template, event))
        return out

    def next_due(self) -> float:
        """When :meth:`due` next may have a held alert (the router's clock; ``inf``: none)."""
        with self._lock:
            return self._limiter.next_due()

    def due(self) -> list[OutboxItem]:
        """Render jobs of held alerts whose interval ended and that change what the caller
        was told."""
        now = self._clock()
        with self._lock:
            ready = self._limiter.due(now)
        by_key = {(t.caller, t.name): t for t in self._enabled()}
        out = []
        for (caller, name, _dedupe), event in ready:
            template = by_key.get((caller, name))
            if template is not None and (
                event.state != common_pb2.FAULT_STATE_RESOLVED or template.resolved_template
            ):
                out.append(self._job(template, event))
        return out

    def _enabled(self) -> list[notifier_pb2.AlertTemplate]:
        out = []
        for template in self._templates_of():
            key = (template.caller, template.name)
            if template.disabled_reason:
                with self._lock:
                    self._disabled.discard(key)  # the store says so now
                continue
            with self._lock:
                if key in self._disabled:
                    continue
            out.append(template)
        return out

    def _job(
        self, template: notifier_pb2.AlertTemplate, event: common_pb2.FaultEvent
    ) -> OutboxItem:
        return OutboxItem(
            id=alert_id(event.id, template),
            destination=json.dumps([template.caller, template.name]),
            value=event.SerializeToString(),
            key=event.group.encode(),
            lane=RENDER_LANE,
            kind="alert",
        )

    def enable(self, caller: str, name: str) -> None:
        """The template was put again: alert with it again."""
        with self._lock:
            self._disabled.discard((caller, name))

    # ---- rendering (the render relay's thread) ------------------------------------------

    def render(self, job: OutboxItem) -> OutboxItem | None:
        """The alert of a render job, for its template's route; None when the template is
        gone or disabled (it was deleted, or failed meanwhile: the alert is not sent)."""
        caller, name = json.loads(job.destination)
        template = next((t for t in self._enabled() if (t.caller, t.name) == (caller, name)), None)
        if template is None:
            log.info(
                "alert dropped: its template is gone or disabled", caller=caller, template=name
            )
            return None
        event = common_pb2.FaultEvent.FromString(job.value)
        try:
            templates.check_route(template, topic_prefix=self._prefix, egress=self._egress)
        except templates.TemplateInvalid as exc:
            self._disable(template, f"route not allowed: {exc.message}")
            return None
        text = (
            template.resolved_template
            if event.state == common_pb2.FAULT_STATE_RESOLVED
            else template.open_template
        )
        try:
            body = self._renderer.render(text, templates.variables(event))
        except LimitExceeded as exc:
            self._metrics.template_errors.labels(template.caller).inc()
            self._disable(template, f"{exc.limit} limit: {exc.message}")
            # This alert still goes out (its fault happened), without the template.
            body = self._fallback(template, event, f"disabled, {exc.message}")
        except TemplateError as exc:
            self._metrics.template_errors.labels(template.caller).inc()
            log.warning(
                "alert template failed to render",
                caller=template.caller,
                template=template.name,
                error=str(exc),
            )
            body = self._fallback(template, event, f"failed: {exc}")
        return self._alert(template, event, body, job.id)

    def trial(self, template: notifier_pb2.AlertTemplate) -> None:
        """Render the template's texts once on a sample event: :class:`TemplateInvalid`
        if one passes a rendering limit (PutAlertTemplate refuses it before storing)."""
        sample = templates.variables(templates.sample_event())
        for field, text in (
            ("template.open_template", template.open_template),
            ("template.resolved_template", template.resolved_template),
        ):
            if not text:
                continue
            try:
                self._renderer.render(text, sample)
            except LimitExceeded as exc:
                raise templates.TemplateInvalid(
                    field, f"passes the {exc.limit} limit on a sample event: {exc.message}"
                ) from None
            except TemplateError:
                pass  # data-dependent: the alert carries the error when it happens

    def _disable(self, template: notifier_pb2.AlertTemplate, why: str) -> None:
        with self._lock:
            self._disabled.add((template.caller, template.name))
        log.warning(
            "alert template disabled", caller=template.caller, template=template.name, why=why
        )
        self._on_failed(template, why)

    @staticmethod
    def _fallback(
        template: notifier_pb2.AlertTemplate, event: common_pb2.FaultEvent, what: str
    ) -> str:
        return (
            f"[template {template.caller}/{template.name} {what}] "
            f"{short_type(event.type)} {short_state(event.state)} group={event.group} "
            f"{event.message}"
        )

    def _alert(
        self,
        template: notifier_pb2.AlertTemplate,
        event: common_pb2.FaultEvent,
        body: str,
        item_id: str,
    ) -> OutboxItem:
        route = template.WhichOneof("route")
        headers = (
            ("ds-id", item_id),
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
                id=item_id,
                destination=template.webhook.url,
                value=body.encode(),
                key=event.group.encode(),
                headers=headers,
                lane=WEBHOOK_LANE,
                kind="alert",
            )
        return OutboxItem(
            id=item_id,
            destination=templates.kafka_topic(template, self._prefix),
            value=body.encode(),
            key=event.group.encode(),
            headers=headers,
            lane=KAFKA_LANE,
            kind="alert",
        )
