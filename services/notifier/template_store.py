"""Alert templates, stored durably in a compacted Kafka topic (``ds.alert_templates``).

Key: JSON ``["caller", "name"]``; value: the serialized ``AlertTemplate``; a delete is a
tombstone. Every notifier replica reads the topic from the beginning at start and keeps
tailing it, so a template put through one replica applies on all of them. A put or delete
is answered once Kafka has it (acks=all); it is applied locally at once, and the tail never
rolls a key back to an older record (each key remembers the offset it was applied from).
"""

from __future__ import annotations

import json
import threading

import structlog
from confluent_kafka.admin import AdminClient

from dataservice.notifier.v1 import notifier_pb2
from services.runtime.settings import ServiceSettings
from services.runtime.topics import CompactedTopic, Record

log = structlog.get_logger(__name__)

TemplateKey = tuple[str, str]
# How long a put or delete waits for Kafka's acknowledgement before it is answered with
# an error (the record may still be written later; the tail then applies it).
WRITE_TIMEOUT_SECONDS = 16.0


def _key(caller: str, name: str) -> bytes:
    return json.dumps([caller, name]).encode()


class TemplateStore:
    def __init__(
        self,
        settings: ServiceSettings,
        topic: str,
        *,
        admin: AdminClient,
        replication: int,
    ) -> None:
        self.topic = topic
        self._topic = CompactedTopic(
            settings,
            topic,
            client_id="ds-notifier-templates",
            replication=replication,
            config={"min.compaction.lag.ms": "0"},
            admin=admin,
        )
        self._lock = threading.Lock()
        self._templates: dict[TemplateKey, notifier_pb2.AlertTemplate] = {}
        self._applied_at: dict[TemplateKey, int] = {}  # offset each key was applied from
        self._started = False

    # ---- lifecycle --------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Create the topic, read it up to its end, then keep tailing it (blocking call)."""
        if self._started:
            return
        self._topic.ensure()
        end = self._topic.load(self._on_record, timeout=timeout)
        self._topic.tail(self._on_record, start=end)
        self._started = True

    def stop(self) -> None:
        """Stop tailing; writes still queued get 5 seconds (blocking call)."""
        self._topic.close(flush_timeout=5)

    # ---- reads ------------------------------------------------------------------------

    def all(self) -> list[notifier_pb2.AlertTemplate]:
        with self._lock:
            return [self._templates[k] for k in sorted(self._templates)]

    def get(self, caller: str, name: str) -> notifier_pb2.AlertTemplate | None:
        with self._lock:
            return self._templates.get((caller, name))

    # ---- writes -----------------------------------------------------------------------

    async def put(self, template: notifier_pb2.AlertTemplate) -> None:
        offset = await self._produce(
            _key(template.caller, template.name), template.SerializeToString()
        )
        self._apply((template.caller, template.name), template, offset)

    async def delete(self, caller: str, name: str) -> None:
        offset = await self._produce(_key(caller, name), None)
        self._apply((caller, name), None, offset)

    async def _produce(self, key: bytes, value: bytes | None) -> int:
        (offset,) = await self._topic.produce([(key, value)], timeout=WRITE_TIMEOUT_SECONDS)
        return offset

    def _apply(
        self, key: TemplateKey, template: notifier_pb2.AlertTemplate | None, offset: int
    ) -> None:
        with self._lock:
            if offset < self._applied_at.get(key, -1):
                return
            self._applied_at[key] = offset
            if template is None:
                self._templates.pop(key, None)
            else:
                self._templates[key] = template

    # ---- records read from the topic (load, then the tail thread) ---------------------

    def _on_record(self, record: Record) -> None:
        try:
            caller, name = json.loads(record.key)
        except (ValueError, TypeError):
            log.warning("alert template record with a bad key skipped", offset=record.offset)
            return
        template: notifier_pb2.AlertTemplate | None = None
        if record.value is not None:
            template = notifier_pb2.AlertTemplate.FromString(record.value)
        self._apply((str(caller), str(name)), template, record.offset)
