"""Durable assigner state in the compacted topic ``__ds_assigner_state`` (ARCHITECTURE §6).

What survives an assigner restart or a leader change: groups (topics, mode, consumer
config, config version), client bindings, the last lease epoch of every partition and the
sidecars an operator drained.
Holders are *not* stored: a restarted leader learns them from the sidecars re-attaching
with their leases (see coordinator: settle + adopt), which is what keeps a restart from
moving anything. Epochs are written, and acknowledged by Kafka (acks=all, idempotent
producer), *before* the grant that carries them is sent, so epochs never go backwards.

Records are keyed by a JSON array (``["group", name]``, ``["epoch", group, topic,
partition]``, ``["binding", group, client_id]``, ``["drain", group, sidecar_id]``) so
compaction keeps the last of each; a null value (tombstone) deletes. The topic has one
partition: order matters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka.admin import AdminClient

from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP
from services.runtime.topics import CompactedTopic

log = structlog.get_logger(__name__)

STATE_TOPIC = "__ds_assigner_state"
# How long a write may wait for Kafka's acknowledgement: librdkafka's default
# message.timeout.ms, the bound state writes have always had. A grant waits for its epoch's
# write, so this is how long a grant is held back while Kafka is unreachable.
WRITE_TIMEOUT_SECONDS = 300.0


@dataclass
class GroupRecord:
    name: str
    topics: list[str]
    mode: str = "leased"
    consumer_config: dict[str, str] = field(default_factory=dict)
    config_version: int = 1
    balance_strategy: str = "count"  # count | load
    # Redelivery (ARCHITECTURE §3 "Delivery"): None / 0 = the sidecars' defaults.
    visibility_timeout_seconds: float | None = None
    max_deliveries: int = 0  # -1: never give a record up

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "name": self.name,
            "topics": self.topics,
            "mode": self.mode,
            "consumer_config": self.consumer_config,
            "config_version": self.config_version,
            "balance_strategy": self.balance_strategy,
        }
        # Written only when set, so records of groups that set neither stay as they were.
        if self.visibility_timeout_seconds is not None:
            document["visibility_timeout_seconds"] = self.visibility_timeout_seconds
        if self.max_deliveries:
            document["max_deliveries"] = self.max_deliveries
        return document


@dataclass
class StateSnapshot:
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    epochs: dict[str, dict[TP, int]] = field(default_factory=dict)
    bindings: dict[str, set[str]] = field(default_factory=dict)
    drained: dict[str, set[str]] = field(default_factory=dict)
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
    elif kind == "drain" and len(parts) == 3:
        drained = snapshot.drained.setdefault(parts[1], set())
        if data is None:
            drained.discard(parts[2])
        else:
            drained.add(parts[2])
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
        # Replication left to the cluster: 3 replicas, min.insync.replicas 2 where it can.
        self._topic = CompactedTopic(
            settings,
            topic,
            client_id="ds-assigner-state",
            admin=admin,
            producer_overrides={"linger.ms": 2},
        )

    # ---- setup and load (blocking: call through asyncio.to_thread) ----------------------

    def ensure_topic(self) -> None:
        self._topic.ensure()

    def load(self) -> StateSnapshot:
        """Read the whole topic, from the beginning to the high watermark."""
        snapshot = StateSnapshot()
        self._topic.load(lambda record: apply_record(snapshot, record.key, record.value))
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

    def put_drain(self, group: str, sidecar_id: str, drained: bool) -> asyncio.Future[None]:
        value = b'{"drained":true}' if drained else None
        return self._write([(_key("drain", group, sidecar_id), value)])

    def _write(self, records: list[tuple[bytes, bytes | None]]) -> asyncio.Future[None]:
        """Produce records now; the future resolves when Kafka acknowledged all of them."""
        written = self._topic.produce(records, timeout=WRITE_TIMEOUT_SECONDS)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(future: asyncio.Future[list[int]]) -> None:
            if done.done():
                return
            if (error := future.exception()) is not None:
                done.set_exception(error)
            else:
                done.set_result(None)

        written.add_done_callback(settle)
        return done

    def close(self) -> None:
        self._topic.close(flush_timeout=10)
