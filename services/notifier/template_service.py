"""Alert-template CRUD over the template store: readiness, idempotent writes, the alerts
topic of a Kafka route, and Kafka failures as ``KAFKA_UNAVAILABLE``.

Requests are validated before they get here (``rpc.py``, with ``templates.validate``:
fields, the alerts prefix, the egress allow-list). A put also checks what needs I/O or
state: the addresses a webhook's host resolves to (``egress.py``), the cap on templates
per caller (``TOO_MANY_TEMPLATES``) and a trial render on a sample event in the render
worker (a template past a rendering limit is refused). A put or delete is answered once
Kafka has it; until the store has read its topic to the end once, every call is refused
with ``SERVICE_NOT_READY`` (the answer would be a guess). Lists redact webhook URLs.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from dataservice.notifier.v1 import notifier_pb2
from dsclient.reasons import DsError, Reason, invalid
from services.notifier import templates
from services.notifier.egress import EgressPolicy, EgressRefused, Target, redact, resolve

log = structlog.get_logger(__name__)

# Request ids of writes remembered for idempotent retries (AIP-155), oldest forgotten first.
IDEMPOTENCY_KEYS = 10_000
NO_EGRESS = EgressPolicy()  # no webhook anywhere


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
        egress: EgressPolicy = NO_EGRESS,
        resolver: Callable[[Target], list[str]] = resolve,
        max_per_caller: int = 100,
        trial: Callable[[notifier_pb2.AlertTemplate], None] = lambda _t: None,
        on_put: Callable[[notifier_pb2.AlertTemplate, bool], Awaitable[None]] | None = None,
    ) -> None:
        """``ready()``: the store has loaded its topic. ``ensure_topic(name)`` creates the
        alerts topic of a Kafka route if missing (blocking; run in a worker thread).
        ``egress`` and ``resolver``: where webhooks may go, and the DNS lookup its check
        uses. ``trial(t)``: renders ``t`` on a sample event, raising TemplateInvalid past a
        limit (blocking). ``on_put(t, was_disabled)``: ``t`` was stored (enabled)."""
        self._store = store
        self._ready = ready
        self._prefix = topic_prefix
        self._ensure_topic = ensure_topic
        self._egress = egress
        self._resolve = resolver
        self._max_per_caller = max_per_caller
        self._trial = trial
        self._on_put = on_put
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
        stored.disabled_reason = ""  # output only: a put enables the template
        previous = self._store.get(stored.caller, stored.name)
        if previous is None:
            self._check_room(stored.caller)
        if stored.WhichOneof("route") == "webhook":
            await asyncio.to_thread(self._check_addresses, stored.webhook.url)
        try:
            await asyncio.to_thread(self._trial, stored)
        except templates.TemplateInvalid as exc:
            raise invalid(exc.field, exc.message) from None
        if stored.WhichOneof("route") == "kafka":
            stored.kafka.topic = templates.kafka_topic(stored, self._prefix)
            await _kafka(asyncio.to_thread(self._ensure_topic, stored.kafka.topic))
        await _kafka(self._store.put(stored))
        self._remember(request_id, stored)
        log.info("alert template stored", caller=stored.caller, template=stored.name)
        if self._on_put is not None:
            await self._on_put(stored, bool(previous is not None and previous.disabled_reason))
        return stored

    def _check_room(self, caller: str) -> None:
        count = sum(1 for t in self._store.all() if t.caller == caller)
        if count >= self._max_per_caller:
            raise DsError(
                Reason.TOO_MANY_TEMPLATES,
                f"caller {caller!r} has {count} alert templates, the most allowed; delete "
                "one or replace one of the same name",
                metadata={"caller": caller, "limit": str(self._max_per_caller)},
            )

    def _check_addresses(self, url: str) -> None:
        """Blocking: the webhook's host resolves only to addresses it may reach."""
        field = "template.webhook.url"
        try:
            target = self._egress.target(url)
            self._egress.check_addresses(target, self._resolve(target))
        except EgressRefused as exc:
            raise DsError(
                Reason.DESTINATION_NOT_ALLOWED, f"{field}: {exc}", metadata={"field": field}
            ) from None
        except OSError as exc:
            raise DsError(
                Reason.DESTINATION_NOT_ALLOWED,
                f"{field}: {redact(url)} does not resolve ({exc})",
                metadata={"field": field},
            ) from None

    async def disable(self, caller: str, name: str, why: str) -> bool:
        """Store the template disabled (``disabled_reason``); False if it is gone or
        disabled already. A put enables it again."""
        current = self._store.get(caller, name)
        if current is None or current.disabled_reason:
            return False
        disabled = notifier_pb2.AlertTemplate()
        disabled.CopyFrom(current)
        disabled.disabled_reason = why[:1024]
        await _kafka(self._store.put(disabled))
        log.warning("alert template stored disabled", caller=caller, template=name, why=why)
        return True

    def list(self, caller: str) -> list[notifier_pb2.AlertTemplate]:
        """Every template, or those of ``caller``; webhook URLs redacted."""
        self._require_ready()
        return [_redacted(t) for t in self._store.all() if not caller or t.caller == caller]

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


def _redacted(template: notifier_pb2.AlertTemplate) -> notifier_pb2.AlertTemplate:
    if template.WhichOneof("route") != "webhook":
        return template
    copy = notifier_pb2.AlertTemplate()
    copy.CopyFrom(template)
    copy.webhook.url = redact(template.webhook.url)
    return copy


async def _kafka(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except DsError:
        raise
    except Exception as exc:
        raise DsError(Reason.KAFKA_UNAVAILABLE, f"alert template not stored: {exc!r}") from exc
