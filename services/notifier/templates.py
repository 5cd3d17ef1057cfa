"""Per-caller alert templates (pure): validation, matching, sandboxed rendering and the
send-interval limiter.

Templates are Jinja2 rendered in an immutable sandbox (no attribute access to internals,
no mutation, no file system); their variables are the FaultEvent's fields by proto name,
with enums as short names (``type`` ``LAG_ERROR``, ``state`` ``OPEN``, ``severity``
``ERROR``), ``partitions`` a list, ``attributes`` a dict and ``detected_at`` an ISO 8601
string — e.g. ``"{{ group }} lag {{ attributes.lag }}"``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jinja2

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.notifier.egress import EgressPolicy, EgressRefused, is_redacted
from services.notifier.sandbox import LimitedSandbox, render_limited
from services.runtime.faults import event_fields

MAX_TEMPLATE_CHARS = 16 * 1024
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_MAX_INTERVAL_SECONDS = 7 * 24 * 3600

# Parsing, and in-process rendering (tests); alerts render in the worker (render_worker.py).
_ENV = LimitedSandbox(max_bytes=64 * 1024)


class TemplateInvalid(ValueError):
    """A template that cannot be stored; ``field`` names the offending request field,
    ``reason`` is ``INVALID_FIELD`` or ``DESTINATION_NOT_ALLOWED`` (a route refused)."""

    def __init__(self, field: str, message: str, reason: str = "INVALID_FIELD") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.reason = reason


def refused(field: str, message: str) -> TemplateInvalid:
    return TemplateInvalid(field, message, reason="DESTINATION_NOT_ALLOWED")


def valid_name(text: str) -> bool:
    """A caller or template name: it becomes part of a Kafka topic name."""
    return bool(_NAME.match(text))


def kafka_topic(template: notifier_pb2.AlertTemplate, prefix: str) -> str:
    """The Kafka topic of a Kafka-routed template (empty topic = ``<prefix><caller>``)."""
    return template.kafka.topic or f"{prefix}{template.caller}"


def validate(
    template: notifier_pb2.AlertTemplate,
    field: str = "template",
    *,
    topic_prefix: str = "ds.alerts.",
    egress: EgressPolicy | None = None,
) -> None:
    """Raise :class:`TemplateInvalid` for anything PutAlertTemplate must refuse: bad
    fields, and a route it may not take (a Kafka topic not under ``topic_prefix``; with
    ``egress``, a webhook host not allow-listed; the addresses it resolves to are checked
    by the caller, which may do I/O)."""
    if not template.caller:
        raise TemplateInvalid(f"{field}.caller", "is required")
    if not _NAME.match(template.caller):
        raise TemplateInvalid(f"{field}.caller", "must be 1-128 of [A-Za-z0-9._-]")
    if not template.name:
        raise TemplateInvalid(f"{field}.name", "is required")
    if not _NAME.match(template.name):
        raise TemplateInvalid(f"{field}.name", "must be 1-128 of [A-Za-z0-9._-]")
    for i, group in enumerate(template.groups):
        if not group:
            raise TemplateInvalid(f"{field}.groups[{i}]", "must not be empty")
    for i, fault_type in enumerate(template.fault_types):
        if fault_type == common_pb2.FAULT_TYPE_UNSPECIFIED:
            raise TemplateInvalid(f"{field}.fault_types[{i}]", "must not be UNSPECIFIED")
        if fault_type not in common_pb2.FaultType.values():
            raise TemplateInvalid(f"{field}.fault_types[{i}]", f"unknown fault type {fault_type}")
    if template.min_severity not in common_pb2.Severity.values():
        raise TemplateInvalid(f"{field}.min_severity", f"unknown severity {template.min_severity}")
    if not template.open_template:
        raise TemplateInvalid(f"{field}.open_template", "is required")
    _parse(template.open_template, f"{field}.open_template")
    if template.resolved_template:
        _parse(template.resolved_template, f"{field}.resolved_template")
    interval = template.send_interval
    if interval.seconds < 0 or interval.nanos < 0 or interval.nanos >= 1_000_000_000:
        raise TemplateInvalid(f"{field}.send_interval", "must be a non-negative duration")
    if interval.seconds > _MAX_INTERVAL_SECONDS:
        raise TemplateInvalid(f"{field}.send_interval", "must be at most 7 days")
    route = template.WhichOneof("route")
    if route is None:
        raise TemplateInvalid(f"{field}.route", "a kafka or webhook route is required")
    if route == "kafka" and template.kafka.topic and not _TOPIC.match(template.kafka.topic):
        raise TemplateInvalid(f"{field}.kafka.topic", "is not a valid Kafka topic name")
    if route == "webhook":
        _check_url(template.webhook.url, f"{field}.webhook.url")
        if is_redacted(template.webhook.url):
            raise TemplateInvalid(
                f"{field}.webhook.url",
                "is a redacted URL as ListAlertTemplates answers it; give the whole URL",
            )
    check_route(template, field, topic_prefix=topic_prefix, egress=egress)


def check_route(
    template: notifier_pb2.AlertTemplate,
    field: str = "template",
    *,
    topic_prefix: str,
    egress: EgressPolicy | None,
) -> None:
    """:class:`TemplateInvalid` (``DESTINATION_NOT_ALLOWED``) for a route the notifier may
    not take: a Kafka topic outside the alerts prefix (an application's data topic, the
    assigner's state topic, ``ds.faults``), or a webhook host not in the egress allow-list.
    Checked at put and again before each alert (templates may predate the rules)."""
    route = template.WhichOneof("route")
    if route == "kafka":
        topic = kafka_topic(template, topic_prefix)
        if not topic.startswith(topic_prefix) or len(topic) == len(topic_prefix):
            raise refused(
                f"{field}.kafka.topic",
                f"{topic!r} is not an alerts topic: it must start with {topic_prefix!r}",
            )
    elif route == "webhook" and egress is not None:
        try:
            egress.target(template.webhook.url)
        except EgressRefused as exc:
            raise refused(f"{field}.webhook.url", str(exc)) from None


def _parse(text: str, field: str) -> None:
    if len(text) > MAX_TEMPLATE_CHARS:
        raise TemplateInvalid(field, f"is longer than {MAX_TEMPLATE_CHARS} characters")
    try:
        _ENV.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateInvalid(field, f"does not parse: {exc.message} (line {exc.lineno})") from None


def _check_url(url: str, field: str) -> None:
    if not url:
        raise TemplateInvalid(field, "is required")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise TemplateInvalid(field, "must be an http:// or https:// URL")
    if not parts.hostname:
        raise TemplateInvalid(field, "has no host")


def matches(template: notifier_pb2.AlertTemplate, event: common_pb2.FaultEvent) -> bool:
    if template.groups and event.group not in template.groups:
        return False
    if template.fault_types and event.type not in template.fault_types:
        return False
    severity = event.severity or common_pb2.SEVERITY_INFO
    return severity >= (template.min_severity or common_pb2.SEVERITY_INFO)


def variables(event: common_pb2.FaultEvent) -> dict[str, Any]:
    """A template's variables: the event's fields (``detected_at`` "" when unknown)."""
    fields = event_fields(event)
    fields["detected_at"] = fields["detected_at"] or ""
    return fields


def render(text: str, event: common_pb2.FaultEvent) -> str:
    """Render one template text in this process (no time limit: tests and tools only;
    the notifier renders in its worker). Raises on a template bug (a sandbox violation, a
    bad filter call) and ``sandbox.OutputTooLarge``."""
    return render_limited(_ENV, text, variables(event))


def sample_event() -> common_pb2.FaultEvent:
    """An event with every field set, for PutAlertTemplate's trial render."""
    event = common_pb2.FaultEvent(
        id="00000000-0000-4000-8000-000000000000",
        type=common_pb2.FAULT_TYPE_LAG_ERROR,
        state=common_pb2.FAULT_STATE_OPEN,
        severity=common_pb2.SEVERITY_ERROR,
        source_service="notifier",
        source_instance="notifier-0",
        group="sample-group",
        topic="sample-topic",
        partitions=[0, 1, 2],
        consumer_id="sidecar-0",
        client_id="client-0",
        message="a sample fault for a trial render",
        dedupe_key="LAG_ERROR|sample-group",
    )
    event.detected_at.FromSeconds(1_700_000_000)
    event.attributes.update({"lag": "12034", "error": "_TRANSPORT", "epoch": "7"})
    return event


@dataclass(frozen=True)
class Offer:
    send: bool
    rate_limited: bool


@dataclass
class _Sent:
    at: float
    state: int
    pending: common_pb2.FaultEvent | None = None


class SendLimiter:
    """At most one alert per (template, fault) per send interval. Inside the interval the
    newest event is held; when the interval ends it is sent only if it changes the state
    last sent (a fault that flapped and cleared gets its resolved message; one that
    flapped back to where it was sends nothing more)."""

    def __init__(self) -> None:
        self._sent: dict[tuple[str, str, str], _Sent] = {}
        self._intervals: dict[tuple[str, str, str], float] = {}

    def offer(
        self, key: tuple[str, str, str], event: common_pb2.FaultEvent, interval: float, now: float
    ) -> Offer:
        sent = self._sent.get(key)
        # Compared as next_due() computes the end (sent.at + interval): the timer sleeps
        # until that very float.
        if interval <= 0 or sent is None or now >= sent.at + interval:
            self._sent[key] = _Sent(now, event.state)
            self._intervals[key] = interval
            return Offer(True, False)
        sent.pending = event
        return Offer(False, True)

    def next_due(self) -> float:
        """When :meth:`due` next may send a held event: the earliest end of an interval
        that holds one (``inf``: none). Intervals ending with nothing held need no tick;
        the next :meth:`due` forgets them."""
        return min(
            (
                sent.at + self._intervals.get(key, 0.0)
                for key, sent in self._sent.items()
                if sent.pending is not None
            ),
            default=math.inf,
        )

    def due(self, now: float) -> list[tuple[tuple[str, str, str], common_pb2.FaultEvent]]:
        out = []
        for key, sent in list(self._sent.items()):
            interval = self._intervals.get(key, 0.0)
            if now < sent.at + interval:
                continue
            pending, sent.pending = sent.pending, None
            if pending is not None and pending.state != sent.state:
                self._sent[key] = _Sent(now, pending.state)
                out.append((key, pending))
            elif pending is None:
                del self._sent[key]
                self._intervals.pop(key, None)
        return out
