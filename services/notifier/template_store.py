"""Alert templates, stored durably in a compacted Kafka topic (``ds.alert_templates``).

Key: JSON ``["caller", "name"]``; value: the serialized ``AlertTemplate``; a delete is a
tombstone. Every notifier replica reads the topic from the beginning at start and keeps
tailing it, so a template put through one replica applies on all of them. A put or delete
is answered once Kafka has it (acks=all); it is applied locally at once, and the tail never
rolls a key back to an older record (each key remembers the offset it was applied from).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from dataservice.notifier.v1 import notifier_pb2
from services.runtime.topics import wait_partitions_serving

log = structlog.get_logger(__name__)

TemplateKey = tuple[str, str]


def _key(caller: str, name: str) -> bytes:
    return json.dumps([caller, name]).encode()


def ensure_topic(
    admin: AdminClient, topic: str, partitions: int, replication: int, config: dict[str, str]
) -> None:
    """Create ``topic`` if it does not exist (an existing one is left as it is), and wait
    until its partitions are served (a write before that can be acknowledged and lost)."""
    futures = admin.create_topics([NewTopic(topic, partitions, replication, config=config)])
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        else:
            log.info("created topic", topic=topic)
            wait_partitions_serving(admin, topic, partitions)


class TemplateStore:
    def __init__(
        self,
        topic: str,
        *,
        admin: AdminClient,
        producer: Producer,
        new_consumer: Callable[[], Consumer],
        replication: int,
    ) -> None:
        self.topic = topic
        self._admin = admin
        self._producer = producer
        self._new_consumer = new_consumer
        self._replication = replication
        self._lock = threading.Lock()
        self._templates: dict[TemplateKey, notifier_pb2.AlertTemplate] = {}
        self._applied_at: dict[TemplateKey, int] = {}  # offset each key was applied from
        self._stop = threading.Event()
        self._loaded = threading.Event()
        self._thread = threading.Thread(target=self._tail, name="templates-tail", daemon=True)

    # ---- lifecycle --------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Create the topic, read it up to its end, then keep tailing it (blocking call)."""
        ensure_topic(
            self._admin,
            self.topic,
            1,
            self._replication,
            {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
        )
        self._thread.start()
        if not self._loaded.wait(timeout):
            raise TimeoutError(f"alert templates not loaded from {self.topic} in {timeout}s")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

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
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()

        def settle(err: KafkaError | None, offset: int) -> None:
            if done.done():
                return  # the caller gave up waiting
            if err is None:
                done.set_result(offset)
            else:
                done.set_exception(KafkaException(err))

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            loop.call_soon_threadsafe(settle, err, int(msg.offset() or 0))

        self._producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)
        # flush() serves the delivery callback (nothing else polls this producer).
        await asyncio.to_thread(self._producer.flush, 15)
        return await asyncio.wait_for(done, 1)

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

    # ---- tail thread --------------------------------------------------------------------

    def _tail(self) -> None:
        while not self._stop.is_set():
            consumer = self._new_consumer()
            try:
                consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
                _low, end = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, 0), timeout=10
                )
                position = 0
                if end == 0:
                    self._loaded.set()
                while not self._stop.is_set():
                    messages = consumer.consume(500, 0.5)
                    for msg in messages:
                        if msg.error() is not None:
                            continue
                        position = int(msg.offset() or 0) + 1
                        self._on_record(msg)
                    if not messages and not self._loaded.is_set():
                        # Compaction can leave gaps: ask where the fetch position is.
                        (tp,) = consumer.position([TopicPartition(self.topic, 0)])
                        position = max(position, int(tp.offset))
                    if position >= end:
                        self._loaded.set()
            except Exception as exc:
                log.warning("alert template reader failed; restarting", error=repr(exc))
                self._stop.wait(1.0)
            finally:
                consumer.close()

    def _on_record(self, msg: Message) -> None:
        raw_key = msg.key()
        try:
            caller, name = json.loads(raw_key if isinstance(raw_key, bytes) else b"")
        except (ValueError, TypeError):
            log.warning("alert template record with a bad key skipped", offset=msg.offset())
            return
        value = msg.value()
        template: notifier_pb2.AlertTemplate | None = None
        if value is not None:
            template = notifier_pb2.AlertTemplate.FromString(
                value if isinstance(value, bytes) else str(value).encode()
            )
        self._apply((str(caller), str(name)), template, int(msg.offset() or 0))
