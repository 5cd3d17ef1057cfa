"""Durable assigner state in the compacted topic ``__ds_assigner_state`` (ARCHITECTURE §6).

What survives an assigner restart or a leader change: groups (topics, mode, consumer
config, config version), client bindings and the last lease epoch of every partition.
Holders are *not* stored: a restarted leader learns them from the sidecars re-attaching
with their leases (see coordinator: settle + adopt), which is what keeps a restart from
moving anything. Epochs are written, and acknowledged by Kafka (acks=all, idempotent
producer), *before* the grant that carries them is sent, so epochs never go backwards.

Records are keyed by a JSON array (``["group", name]``, ``["epoch", group, topic,
partition]``, ``["binding", group, client_id]``) so compaction keeps the last of each; a
null value (tombstone) deletes. The topic has one partition: order matters.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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

from services.assigner.balancer import TopicPartition as TP
from services.runtime.kafka import new_admin, new_producer
from services.runtime.settings import ServiceSettings
from services.runtime.topics import wait_partitions_serving

log = structlog.get_logger(__name__)

STATE_TOPIC = "__ds_assigner_state"


@dataclass
class GroupRecord:
    name: str
    topics: list[str]
    mode: str = "leased"
    consumer_config: dict[str, str] = field(default_factory=dict)
    config_version: int = 1
    balance_strategy: str = "count"  # count | load

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topics": self.topics,
            "mode": self.mode,
            "consumer_config": self.consumer_config,
            "config_version": self.config_version,
            "balance_strategy": self.balance_strategy,
        }


@dataclass
class StateSnapshot:
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    epochs: dict[str, dict[TP, int]] = field(default_factory=dict)
    bindings: dict[str, set[str]] = field(default_factory=dict)
    records: int = 0


def _key(*parts: object) -> bytes:
    return json.dumps(list(parts), separators=(",", ":")).encode()


def apply_record(snapshot: StateSnapshot, key: bytes, value: bytes | None) -> None:
    """Fold one state record into the snapshot (pure; unknown kinds are skipped)."""
    try:
        parts = json.loads(key)
    except ValueError:
        log.warning("skipping a state record with an unreadable key", key=key[:80])
        return
    kind = parts[0] if parts else None
    data = json.loads(value) if value is not None else None
    if kind == "group" and len(parts) == 2:
        if data is None:
            snapshot.groups.pop(parts[1], None)
        else:
            snapshot.groups[parts[1]] = GroupRecord(**data)
    elif kind == "epoch" and len(parts) == 4:
        epochs = snapshot.epochs.setdefault(parts[1], {})
        tp = TP(parts[2], int(parts[3]))
        if data is None:
            epochs.pop(tp, None)
        else:
            # Never let a replayed older record lower an epoch.
            epochs[tp] = max(epochs.get(tp, 0), int(data["epoch"]))
    elif kind == "binding" and len(parts) == 3:
        clients = snapshot.bindings.setdefault(parts[1], set())
        if data is None:
            clients.discard(parts[2])
        else:
            clients.add(parts[2])
    snapshot.records += 1


class StateStore:
    def __init__(
        self,
        settings: ServiceSettings,
        *,
        topic: str = STATE_TOPIC,
        admin: AdminClient | None = None,
    ) -> None:
        self.topic = topic
        self._settings = settings
        self._admin: AdminClient = admin or new_admin(settings, client_id="ds-assigner-state")
        self._producer: Producer = new_producer(
            settings, client_id="ds-assigner-state", overrides={"linger.ms": 2}
        )
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="state-producer", daemon=True)
        self._poller.start()

    # ---- setup and load (blocking: call through asyncio.to_thread) ----------------------

    def ensure_topic(self) -> None:
        metadata = self._admin.list_topics(timeout=10)
        if self.topic in metadata.topics:
            return
        replication = min(3, len(metadata.brokers))
        new = NewTopic(
            self.topic,
            num_partitions=1,
            replication_factor=replication,
            config={
                "cleanup.policy": "compact",
                "min.insync.replicas": str(min(2, replication)),
            },
        )
        for future in self._admin.create_topics([new]).values():
            error = future.exception()
            if error is not None and not _already_exists(error):
                raise error
        log.info("created the state topic", topic=self.topic, replication=replication)
        self._wait_for_leader(deadline=time.monotonic() + 30)

    def _wait_for_leader(self, deadline: float) -> None:
        """A topic just created is not served for a moment (reads time out, and writes can
        be acknowledged and lost): wait, bounded, until its leader answers ListOffsets."""
        wait_partitions_serving(self._admin, self.topic, 1, timeout=deadline - time.monotonic())

    def load(self) -> StateSnapshot:
        """Read the whole topic, from the beginning to the high watermark."""
        snapshot = StateSnapshot()
        consumer = Consumer(
            {
                "bootstrap.servers": self._settings.bootstrap,
                "group.id": "ds-assigner-state-reader",  # never commits; assign() only
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                **self._settings.kafka,
            }
        )
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=10)
            if high <= low:
                return snapshot
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            position = low
            deadline = time.monotonic() + 60
            while position < high:
                if time.monotonic() > deadline:
                    raise KafkaException(
                        f"state topic {self.topic}: read stalled at {position} of {high}"
                    )
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break
                    raise KafkaException(error)
                apply_record(snapshot, msg.key() or b"", msg.value())
                position = int(msg.offset() or 0) + 1
        finally:
            consumer.close()
        log.info(
            "state loaded",
            records=snapshot.records,
            groups=len(snapshot.groups),
            epochs=sum(len(e) for e in snapshot.epochs.values()),
        )
        return snapshot

    # ---- writes -----------------------------------------------------------------------

    def put_group(self, record: GroupRecord) -> asyncio.Future[None]:
        return self._write([(_key("group", record.name), json.dumps(record.to_json()).encode())])

    def put_epochs(self, group: str, epochs: Iterable[tuple[TP, int]]) -> asyncio.Future[None]:
        return self._write(
            [
                (_key("epoch", group, tp.topic, tp.partition), json.dumps({"epoch": e}).encode())
                for tp, e in epochs
            ]
        )

    def put_binding(self, group: str, client_id: str) -> asyncio.Future[None]:
        return self._write([(_key("binding", group, client_id), b'{"bound":true}')])

    def delete_binding(self, group: str, client_id: str) -> asyncio.Future[None]:
        return self._write([(_key("binding", group, client_id), None)])

    def _write(self, records: list[tuple[bytes, bytes | None]]) -> asyncio.Future[None]:
        """Produce records; the future resolves when Kafka acknowledged all of them."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        remaining = len(records)

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            nonlocal remaining

            def settle() -> None:
                nonlocal remaining
                if done.done():
                    return
                if err is not None:
                    done.set_exception(KafkaException(err))
                    return
                remaining -= 1
                if remaining == 0:
                    done.set_result(None)

            loop.call_soon_threadsafe(settle)

        try:
            for key, value in records:
                self._producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)
        except (BufferError, KafkaException) as exc:
            done.set_exception(exc)
        if not records:
            done.set_result(None)
        return done

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def close(self) -> None:
        self._producer.flush(10)
        self._stop.set()
        self._poller.join(timeout=5)


def _already_exists(error: object) -> bool:
    args = getattr(error, "args", ())
    code = args[0].code() if args and isinstance(args[0], KafkaError) else None
    return code == KafkaError.TOPIC_ALREADY_EXISTS
