"""NotifierService servicer: ReportFault, ListFaults and WatchFaults.

Alert templates are part of the API and answer UNIMPLEMENTED until the notifier issue
builds them (with the durable outbox, storm suppression and lag evaluation).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc.aio

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from services.runtime.errors import invalid, not_implemented

if TYPE_CHECKING:
    from services.notifier.app import NotifierApp

Context = grpc.aio.ServicerContext[Any, Any]
MAX_PAGE = 1000


def _matches(event: common_pb2.FaultEvent, group: str, types: set[int]) -> bool:
    return (not group or event.group == group) and (not types or event.type in types)


class NotifierServicer(notifier_pb2_grpc.NotifierServiceServicer):
    def __init__(self, app: NotifierApp) -> None:
        self.app = app

    async def ReportFault(
        self, request: notifier_pb2.ReportFaultRequest, context: Context
    ) -> notifier_pb2.ReportFaultResponse:
        if not request.HasField("event"):
            raise invalid("event", "is required")
        event = request.event
        if event.type == common_pb2.FAULT_TYPE_UNSPECIFIED:
            raise invalid("event.type", "must name a fault type")
        if event.type not in common_pb2.FaultType.values():
            raise invalid("event.type", f"unknown fault type {event.type}")
        if event.state == common_pb2.FAULT_STATE_UNSPECIFIED:
            raise invalid("event.state", "must be OPEN or RESOLVED")
        if event.severity == common_pb2.SEVERITY_UNSPECIFIED:
            raise invalid("event.severity", "must be set")
        if not event.source_service:
            raise invalid("event.source_service", "must name the reporting service")
        published = await self.app.publish(event)
        return notifier_pb2.ReportFaultResponse(event_id=published.id, suppressed=False)

    async def ListFaults(
        self, request: notifier_pb2.ListFaultsRequest, context: Context
    ) -> notifier_pb2.ListFaultsResponse:
        if request.page_size < 0 or request.page_size > MAX_PAGE:
            raise invalid("page_size", f"must be between 0 and {MAX_PAGE}")
        start = 0
        if request.page_token:
            if not request.page_token.isdigit():
                raise invalid("page_token", "is not a token returned by ListFaults")
            start = int(request.page_token)
        size = request.page_size or 100
        types = {int(t) for t in request.types}
        matching = [
            e
            for e in reversed(self.app.recent)
            if _matches(e, request.group, types)
            and not (request.open_only and e.state != common_pb2.FAULT_STATE_OPEN)
        ]
        page = matching[start : start + size]
        token = str(start + size) if start + size < len(matching) else ""
        return notifier_pb2.ListFaultsResponse(faults=page, next_page_token=token)

    async def WatchFaults(
        self, request: notifier_pb2.WatchFaultsRequest, context: Context
    ) -> AsyncIterator[notifier_pb2.WatchFaultsResponse]:
        queue: asyncio.Queue[common_pb2.FaultEvent] = asyncio.Queue(maxsize=10_000)
        self.app.watchers.add(queue)
        types = {int(t) for t in request.types}
        try:
            while True:
                event = await queue.get()
                if _matches(event, request.group, types):
                    yield notifier_pb2.WatchFaultsResponse(event=event)
        finally:
            self.app.watchers.discard(queue)

    async def PutAlertTemplate(
        self, request: notifier_pb2.PutAlertTemplateRequest, context: Context
    ) -> notifier_pb2.PutAlertTemplateResponse:
        await not_implemented(context, "NotifierService.PutAlertTemplate")

    async def ListAlertTemplates(
        self, request: notifier_pb2.ListAlertTemplatesRequest, context: Context
    ) -> notifier_pb2.ListAlertTemplatesResponse:
        await not_implemented(context, "NotifierService.ListAlertTemplates")

    async def DeleteAlertTemplate(
        self, request: notifier_pb2.DeleteAlertTemplateRequest, context: Context
    ) -> notifier_pb2.DeleteAlertTemplateResponse:
        await not_implemented(context, "NotifierService.DeleteAlertTemplate")
