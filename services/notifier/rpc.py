"""NotifierService servicer: request validation and answers. The work is done by the two
objects it is given: the fault pipeline (``pipeline.py``: report, list, watch) and the
template service (``template_service.py``: put, list, delete).

Every RPC validates its request first and fails with INVALID_ARGUMENT / ``INVALID_FIELD``
(metadata ``field`` names the field) before touching any state. A fault report is held to
the ``report_limits`` setting (attribute count and sizes, partitions, message, the whole
event), so whatever a reporter sends, an accepted event fits in a Kafka message.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc.aio

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dsclient.reasons import DsError, Reason, invalid
from services.notifier import templates
from services.notifier.egress import EgressPolicy
from services.notifier.pipeline import FaultPipeline
from services.notifier.settings import ReportLimits
from services.notifier.template_service import TemplateService

Context = grpc.aio.ServicerContext[Any, Any]
MAX_PAGE = 1000
_PAGE_TOKEN = re.compile(r"[0-9]{1,18}")
MAX_NAME = 255
DEFAULT_LIMITS = ReportLimits()
NO_EGRESS = EgressPolicy()


def _matches(event: common_pb2.FaultEvent, group: str, types: set[int]) -> bool:
    return (not group or event.group == group) and (not types or event.type in types)


def _check_uuid(value: str, field: str) -> None:
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        raise invalid(field, f"{value!r} is not a UUID") from None
    if str(parsed) != value:
        raise invalid(field, "must be a lowercase hyphenated UUID")


def _check_types(types: Iterable[int], field: str) -> set[int]:
    known = set(common_pb2.FaultType.values())
    out = set()
    for i, value in enumerate(types):
        if value == common_pb2.FAULT_TYPE_UNSPECIFIED:
            raise invalid(f"{field}[{i}]", "must not be FAULT_TYPE_UNSPECIFIED")
        if value not in known:
            raise invalid(f"{field}[{i}]", f"unknown fault type {value}")
        out.add(int(value))
    return out


def validate_event(event: common_pb2.FaultEvent, limits: ReportLimits = DEFAULT_LIMITS) -> None:
    if event.id:
        _check_uuid(event.id, "event.id")
    if event.type == common_pb2.FAULT_TYPE_UNSPECIFIED:
        raise invalid("event.type", "must name a fault type")
    if event.type not in common_pb2.FaultType.values():
        raise invalid("event.type", f"unknown fault type {event.type}")
    if event.state not in (common_pb2.FAULT_STATE_OPEN, common_pb2.FAULT_STATE_RESOLVED):
        raise invalid("event.state", "must be FAULT_STATE_OPEN or FAULT_STATE_RESOLVED")
    if event.severity == common_pb2.SEVERITY_UNSPECIFIED:
        raise invalid("event.severity", "must be set")
    if event.severity not in common_pb2.Severity.values():
        raise invalid("event.severity", f"unknown severity {event.severity}")
    if not event.source_service:
        raise invalid("event.source_service", "must name the reporting service")
    for name in ("source_service", "source_instance", "group", "topic", "consumer_id", "client_id"):
        if len(getattr(event, name)) > MAX_NAME:
            raise invalid(f"event.{name}", f"is longer than {MAX_NAME} characters")
    if len(event.partitions) > limits.max_partitions:
        raise invalid("event.partitions", f"more than {limits.max_partitions} partitions")
    if any(p < 0 for p in event.partitions):
        raise invalid("event.partitions", "must not be negative")
    _check_attributes(event, limits)
    if len(event.message.encode()) > limits.max_message_bytes:
        raise invalid("event.message", f"is longer than {limits.max_message_bytes} bytes")
    if len(event.dedupe_key) > 1024:
        raise invalid("event.dedupe_key", "is longer than 1024 characters")
    if event.suppressed_count < 0:
        raise invalid("event.suppressed_count", "must not be negative")
    if event.ByteSize() > limits.max_event_bytes:
        raise invalid("event", f"is larger than {limits.max_event_bytes} bytes serialized")


def _check_attributes(event: common_pb2.FaultEvent, limits: ReportLimits) -> None:
    if len(event.attributes) > limits.max_attributes:
        raise invalid("event.attributes", f"more than {limits.max_attributes} attributes")
    for key, value in event.attributes.items():
        # The field names the key, cut short: it may itself be what is too long.
        field = f"event.attributes[{key[:64]}]"
        if len(key.encode()) > limits.max_attribute_key_bytes:
            raise invalid(field, f"key is longer than {limits.max_attribute_key_bytes} bytes")
        if len(value.encode()) > limits.max_attribute_value_bytes:
            raise invalid(field, f"is longer than {limits.max_attribute_value_bytes} bytes")


class NotifierServicer(notifier_pb2_grpc.NotifierServiceServicer):
    def __init__(
        self,
        pipeline: FaultPipeline,
        template_service: TemplateService,
        *,
        limits: ReportLimits = DEFAULT_LIMITS,
        topic_prefix: str = "ds.alerts.",
        egress: EgressPolicy = NO_EGRESS,
    ) -> None:
        """``limits``: what a fault report may carry. ``topic_prefix``, ``egress``: where
        alert routes may go (default: no webhook anywhere)."""
        self._pipeline = pipeline
        self._templates = template_service
        self._limits = limits
        self._topic_prefix = topic_prefix
        self._egress = egress

    async def ReportFault(
        self, request: notifier_pb2.ReportFaultRequest, context: Context
    ) -> notifier_pb2.ReportFaultResponse:
        if not request.HasField("event"):
            raise invalid("event", "is required")
        validate_event(request.event, self._limits)
        event_id, suppressed = await self._pipeline.report(request.event)
        return notifier_pb2.ReportFaultResponse(event_id=event_id, suppressed=suppressed)

    async def ListFaults(
        self, request: notifier_pb2.ListFaultsRequest, context: Context
    ) -> notifier_pb2.ListFaultsResponse:
        if request.page_size < 0 or request.page_size > MAX_PAGE:
            raise invalid("page_size", f"must be between 0 and {MAX_PAGE}")
        start = 0
        if request.page_token:
            # ASCII digits only: str.isdigit() accepts "¹", which int() refuses. A token is
            # an offset into the recent faults, never longer than 18 digits.
            if not _PAGE_TOKEN.fullmatch(request.page_token):
                raise invalid("page_token", "is not a token returned by ListFaults")
            start = int(request.page_token)
        types = _check_types(request.types, "types")
        size = request.page_size or 100
        recent = self._pipeline.recent()
        if request.open_only:
            recent = _still_open(recent)
        matching = [e for e in reversed(recent) if _matches(e, request.group, types)]
        page = matching[start : start + size]
        token = str(start + size) if start + size < len(matching) else ""
        return notifier_pb2.ListFaultsResponse(faults=page, next_page_token=token)

    async def WatchFaults(
        self, request: notifier_pb2.WatchFaultsRequest, context: Context
    ) -> AsyncIterator[notifier_pb2.WatchFaultsResponse]:
        types = _check_types(request.types, "types")
        with self._pipeline.watch() as queue:
            while True:
                event = await queue.get()
                if _matches(event, request.group, types):
                    yield notifier_pb2.WatchFaultsResponse(event=event)

    async def PutAlertTemplate(
        self, request: notifier_pb2.PutAlertTemplateRequest, context: Context
    ) -> notifier_pb2.PutAlertTemplateResponse:
        if not request.HasField("template"):
            raise invalid("template", "is required")
        if request.request_id:
            _check_uuid(request.request_id, "request_id")
        try:
            templates.validate(
                request.template, topic_prefix=self._topic_prefix, egress=self._egress
            )
        except templates.TemplateInvalid as exc:
            raise DsError(
                Reason(exc.reason), f"{exc.field}: {exc.message}", metadata={"field": exc.field}
            ) from None
        stored = await self._templates.put(request.template, request.request_id)
        return notifier_pb2.PutAlertTemplateResponse(template=stored)

    async def ListAlertTemplates(
        self, request: notifier_pb2.ListAlertTemplatesRequest, context: Context
    ) -> notifier_pb2.ListAlertTemplatesResponse:
        if request.caller and not templates.valid_name(request.caller):
            raise invalid("caller", "must be 1-128 of [A-Za-z0-9._-]")
        found = self._templates.list(request.caller)
        return notifier_pb2.ListAlertTemplatesResponse(templates=found)

    async def DeleteAlertTemplate(
        self, request: notifier_pb2.DeleteAlertTemplateRequest, context: Context
    ) -> notifier_pb2.DeleteAlertTemplateResponse:
        if not request.caller:
            raise invalid("caller", "is required")
        if not request.name:
            raise invalid("name", "is required")
        if request.request_id:
            _check_uuid(request.request_id, "request_id")
        await self._templates.delete(request.caller, request.name, request.request_id)
        return notifier_pb2.DeleteAlertTemplateResponse()


def _still_open(events: list[common_pb2.FaultEvent]) -> list[common_pb2.FaultEvent]:
    """OPEN events whose dedupe key has not been resolved since."""
    latest: dict[str, int] = {}
    for event in events:
        latest[event.dedupe_key] = event.state
    return [
        e
        for e in events
        if e.state == common_pb2.FAULT_STATE_OPEN
        and latest[e.dedupe_key] == common_pb2.FAULT_STATE_OPEN
    ]
