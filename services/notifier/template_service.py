"""Alert-template CRUD over the template store: readiness, idempotent writes, the alerts
topic of a Kafka route, and Kafka failures as ``KAFKA_UNAVAILABLE``.

Requests are validated before they get here (``rpc.py``, with ``templates.validate``).
A put or delete is answered once Kafka has it; until the store has read its topic to the
end once, every call is refused with ``SERVICE_NOT_READY`` (the answer would be a guess).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from dataservice.notifier.v1 import notifier_pb2
from services.notifier import templates
from services.runtime.errors import DsError, Reason

log = structlog.get_logger(__name__)

# Request ids of writes remembered for idempotent retries (AIP-155), oldest forgotten first.
IDEMPOTENCY_KEYS = 10_000


class TemplateRecords(Protocol):
    """Where templates are kept (``template_store.TemplateStore``: a compacted topic)."""

    def all(self) -> list[notifier_pb2.AlertTemplate]: ...

    def get(self, caller: str, name: str) -> notifier_pb2.AlertTemplate | None: ...

    async def put(self, template: notifier_pb2.AlertTemplate) -> None: ...

    async def delete(self, caller: str, name: str) -> None: ...


class TemplateService:
    def __init__(
        self,
        store: TemplateRecords,
        *,
        ready: Callable[[], bool],
        topic_prefix: str,
        ensure_topic: Callable[[str], None],
    ) -> None:
        """``ready()``: the store has loaded its topic. ``ensure_topic(name)`` creates the
        alerts topic of a Kafka route if missing (blocking; run in a worker thread)."""
        self._store = store
        self._ready = ready
        self._prefix = topic_prefix
        self._ensure_topic = ensure_topic
        self._idempotent: OrderedDict[str, notifier_pb2.AlertTemplate | None] = OrderedDict()

    async def put(
        self, template: notifier_pb2.AlertTemplate, request_id: str
    ) -> notifier_pb2.AlertTemplate:
        """Store (create or replace) a valid template; returns it as stored (a Kafka route
        names its topic). A repeated ``request_id`` returns the first answer."""
        self._require_ready()
        if request_id in self._idempotent and (done := self._idempotent[request_id]) is not None:
            return done
        stored = notifier_pb2.AlertTemplate()
        stored.CopyFrom(template)
        if stored.WhichOneof("route") == "kafka":
            stored.kafka.topic = templates.kafka_topic(stored, self._prefix)
            await _kafka(asyncio.to_thread(self._ensure_topic, stored.kafka.topic))
        await _kafka(self._store.put(stored))
        self._remember(request_id, stored)
        log.info("alert template stored", caller=stored.caller, template=stored.name)
        return stored

    def list(self, caller: str) -> list[notifier_pb2.AlertTemplate]:
        """Every template, or those of ``caller``."""
        self._require_ready()
        return [t for t in self._store.all() if not caller or t.caller == caller]

    async def delete(self, caller: str, name: str, request_id: str) -> None:
        """Delete a template; ``ALERT_TEMPLATE_NOT_FOUND`` if there is none (unless
        ``request_id`` repeats a delete that was done)."""
        self._require_ready()
        if request_id and request_id in self._idempotent:
            return
        if self._store.get(caller, name) is None:
            raise DsError(
                Reason.ALERT_TEMPLATE_NOT_FOUND,
                f"no alert template {name!r} of caller {caller!r}",
                metadata={"caller": caller, "name": name},
            )
        await _kafka(self._store.delete(caller, name))
        self._remember(request_id, None)
        log.info("alert template deleted", caller=caller, template=name)

    def _require_ready(self) -> None:
        if not self._ready():
            raise DsError(
                Reason.SERVICE_NOT_READY, "alert templates are not loaded yet (Kafka unreachable)"
            )

    def _remember(self, request_id: str, answer: notifier_pb2.AlertTemplate | None) -> None:
        if request_id:
            self._idempotent[request_id] = answer
            while len(self._idempotent) > IDEMPOTENCY_KEYS:
                self._idempotent.popitem(last=False)


async def _kafka(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except DsError:
        raise
    except Exception as exc:
        raise DsError(Reason.KAFKA_UNAVAILABLE, f"alert template not stored: {exc!r}") from exc
