"""Durable assigner state in the compacted topic ``__ds_assigner_state`` (ARCHITECTURE §6).

What survives an assigner restart or a leader change: groups (topics, mode, consumer
config, config version), client bindings, the last lease epoch of every partition and the
sidecars an operator drained.
Holders are *not* stored: a restarted leader learns them from the sidecars re-attaching
with their leases (see coordinator: settle + adopt), which is what keeps a restart from
moving anything. Epochs are written, and acknowledged by Kafka (acks=all, idempotent
producer), *before* the grant that carries them is sent, so epochs never go backwards;
such a write is bounded (``state_write_timeout_seconds``): a grant whose epoch is not
durable by then is taken back and decided again, never sent.

Records are keyed by a JSON array (``["group", name]``, ``["epoch", group, topic,
partition]``, ``["binding", group, client_id]``, ``["drain", group, sidecar_id]``,
``["term"]`` — a leader confirming its term while Consul is unreachable) so
compaction keeps the last of each; a null value (tombstone) deletes a binding or ends a
drain (groups and epochs are never deleted). The topic has one partition: order matters.

Only the assigner writes the topic (README "State topic": the Kafka ACLs that make it so),
but a record that does not parse — written by hand, by another tool, or by a newer
assigner — is logged, counted (``ds_assigner_state_bad_records_total``) and skipped; it
never stops loading, and so never stops a replica from taking leadership.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka.admin import AdminClient
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP
from services.runtime.topics import CompactedTopic
from services.runtime.txn_writer import TransactionalWriter

log = structlog.get_logger(__name__)

STATE_TOPIC = "__ds_assigner_state"
# How long a group or binding write may wait for Kafka's acknowledgement: librdkafka's
# default message.timeout.ms, the bound these writes have always had. Epoch writes have
# their own, short bound (state_write_timeout_seconds): a grant waits for its epoch.
WRITE_TIMEOUT_SECONDS = 300.0
DEFAULT_EPOCH_WRITE_TIMEOUT = 5.0


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
    # A committed offset the mesh did not write (issue 23): follow | revert | ignore.
    external_offset_changes: str = "follow"
    # Issue 39: where records given up past max_deliveries go ("" = the sidecars' setting).
    dead_letter_topic: str = ""
    # Issue 39: unordered | key | partition (enforced by the sidecars).
    ordering: str = "unordered"
    # Issue 36: lease | kafka ("" = each sidecar's commit_fencing setting).
    commit_fencing: str = ""
    # Issue 36: the group's failure detection (None = the assigner's settings); only a
    # ``kafka``-fenced group carries its own (services/assigner/group_timing.py).
    lease_ttl_seconds: float | None = None
    heartbeat_interval_seconds: float | None = None

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
        if self.external_offset_changes != "follow":
            document["external_offset_changes"] = self.external_offset_changes
        if self.dead_letter_topic:
            document["dead_letter_topic"] = self.dead_letter_topic
        if self.ordering != "unordered":
            document["ordering"] = self.ordering
        if self.commit_fencing:
            document["commit_fencing"] = self.commit_fencing
        if self.lease_ttl_seconds is not None:
            document["lease_ttl_seconds"] = self.lease_ttl_seconds
        if self.heartbeat_interval_seconds is not None:
            document["heartbeat_interval_seconds"] = self.heartbeat_interval_seconds
        return document


@dataclass
class StateSnapshot:
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    epochs: dict[str, dict[TP, int]] = field(default_factory=dict)
    # The member each current epoch was granted to (absent: unknown, or a reset's epoch).
    holders: dict[str, dict[TP, str]] = field(default_factory=dict)
    bindings: dict[str, set[str]] = field(default_factory=dict)
    drained: dict[str, set[str]] = field(default_factory=dict)
    # The last leader that confirmed its term through the topic (a Consul outage).
    term_leader: str | None = None
    records: int = 0  # records applied
    # Records that did not parse, skipped, by their key's kind (group, epoch, binding,
    # drain, unknown): ds_assigner_state_bad_records_total.
    bad_records: dict[str, int] = field(default_factory=dict)


def _key(*parts: object) -> bytes:
    return json.dumps(list(parts), separators=(",", ":")).encode()


# Values a group record may hold in its enumerated fields (what groups.py can serve).
GROUP_MODES = frozenset({"leased", "kafka_group"})
BALANCE_STRATEGIES = frozenset({"count", "load"})
EXTERNAL_OFFSET_CHANGES = frozenset({"follow", "revert", "ignore"})
ORDERINGS = frozenset({"unordered", "key", "partition"})
COMMIT_FENCINGS = frozenset({"", "lease", "kafka"})


def _strict_model(cls: type[Any]) -> type[BaseModel]:
    """A strict pydantic model with the dataclass's fields (types, defaults): what a JSON
    value must hold to become one. Unknown keys are ignored (a newer writer's fields)."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        elif f.default is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], f.default)
        else:
            fields[f.name] = (hints[f.name], ...)
    config = ConfigDict(strict=True, extra="ignore")
    model: type[BaseModel] = create_model(f"{cls.__name__}Value", __config__=config, **fields)
    return model


_GROUP_VALUE = _strict_model(GroupRecord)


class BadRecord(ValueError):
    """A state record that does not parse; ``kind`` is its key's kind (or ``unknown``)."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why


def apply_record(snapshot: StateSnapshot, key: bytes, value: bytes | None) -> None:
    """Fold one state record into the snapshot (pure). A record that does not parse is
    counted in ``snapshot.bad_records`` by kind and skipped; it never raises, so whatever
    was written to the topic, loading (and with it leadership) goes on."""
    try:
        _apply(snapshot, key, value)
    except BadRecord as bad:
        snapshot.bad_records[bad.kind] = snapshot.bad_records.get(bad.kind, 0) + 1
        log.warning(
            "skipping a state record that does not parse",
            kind=bad.kind,
            why=bad.why,
            key=key[:120],
        )
        return
    snapshot.records += 1


def _apply(snapshot: StateSnapshot, key: bytes, value: bytes | None) -> None:
    parts = _json(key, "unknown", "key")
    if not isinstance(parts, list) or not parts or not isinstance(parts[0], str):
        raise BadRecord("unknown", "the key is not a JSON list starting with its kind")
    kind = parts[0]
    if kind == "group":
        name = _names(parts, 2, kind)[0]
        if value is None:
            # DeleteGroup: the group, its bindings and drains go; its epochs stay (an epoch
            # never goes back, not even for a group created again under the name).
            snapshot.groups.pop(name, None)
            snapshot.bindings.pop(name, None)
            snapshot.drained.pop(name, None)
            return
        snapshot.groups[name] = _group(name, _json(value, kind, "value"))
    elif kind == "epoch":
        group, topic, partition = _names(parts, 4, kind, last_int=True)
        # Epochs only grow: a tombstone (back to none) is never written, so never applied.
        data = _json(_value(value, kind), kind, "value")
        epoch = _epoch(data)
        epochs = snapshot.epochs.setdefault(str(group), {})
        holders = snapshot.holders.setdefault(str(group), {})
        tp = TP(str(topic), int(partition))
        # Never let a replayed older record lower an epoch.
        if epoch >= epochs.get(tp, 0):
            holder = data.get("holder")
            if isinstance(holder, str) and holder:
                holders[tp] = holder
            else:
                holders.pop(tp, None)
        epochs[tp] = max(epochs.get(tp, 0), epoch)
    elif kind == "binding":  # Unbind writes a tombstone
        _apply_membership(snapshot.bindings, parts, value, kind)
    elif kind == "drain":  # UndrainSidecar writes a tombstone
        _apply_membership(snapshot.drained, parts, value, kind)
    elif kind == "term":  # a leader confirming its term while Consul is unreachable
        _names(parts, 1, kind)
        leader = _json(_value(value, kind), kind, "value")
        if not isinstance(leader, dict) or not isinstance(leader.get("leader"), str):
            raise BadRecord(kind, 'a term value is {"leader": "HOST:PORT"}')
        snapshot.term_leader = leader["leader"]
    else:
        raise BadRecord("unknown", f"unknown record kind {kind[:40]!r}")


def _json(raw: bytes, kind: str, what: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, TypeError):  # UnicodeDecodeError is a ValueError
        raise BadRecord(kind, f"the {what} is not JSON") from None


def _value(value: bytes | None, kind: str) -> bytes:
    if value is None:
        raise BadRecord(kind, f"a null value (tombstone) is never written for a {kind} record")
    return value


def _names(parts: list[Any], size: int, kind: str, *, last_int: bool = False) -> list[Any]:
    """The key's coordinates after its kind: ``size - 1`` strings (the last one a
    partition number >= 0 with ``last_int``)."""
    names = parts[1:]
    if len(parts) != size:
        raise BadRecord(kind, f"a {kind} key has {size - 1} parts after the kind")
    text = names[:-1] if last_int else names
    if not all(isinstance(n, str) and n for n in text):
        raise BadRecord(kind, f"a {kind} key names its coordinates as non-empty strings")
    if last_int:
        last = names[-1]
        if isinstance(last, bool) or not isinstance(last, int) or last < 0:
            raise BadRecord(kind, "an epoch key's partition is an integer >= 0")
    return names


def _group(name: str, data: Any) -> GroupRecord:
    if not isinstance(data, dict):
        raise BadRecord("group", "a group value is a JSON object")
    try:
        record = GroupRecord(**_GROUP_VALUE.model_validate(data).model_dump())
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise BadRecord("group", f"a group value lacks or mistypes fields ({errors})") from None
    if record.name != name:
        raise BadRecord("group", f"the value names group {record.name[:40]!r}, the key {name!r}")
    if not record.topics or not all(record.topics):
        raise BadRecord("group", "a group has at least one topic, each named")
    if record.mode not in GROUP_MODES:
        raise BadRecord("group", f"unknown mode {record.mode[:40]!r}")
    if record.balance_strategy not in BALANCE_STRATEGIES:
        raise BadRecord("group", f"unknown balance strategy {record.balance_strategy[:40]!r}")
    if record.external_offset_changes not in EXTERNAL_OFFSET_CHANGES:
        raise BadRecord(
            "group", f"unknown external_offset_changes {record.external_offset_changes[:40]!r}"
        )
    if record.ordering not in ORDERINGS:
        raise BadRecord("group", f"unknown ordering {record.ordering[:40]!r}")
    if record.commit_fencing not in COMMIT_FENCINGS:
        raise BadRecord("group", f"unknown commit_fencing {record.commit_fencing[:40]!r}")
    if record.config_version < 1:
        raise BadRecord("group", "config_version is >= 1")
    return record


def _epoch_value(epoch: int, holder: str | None) -> dict[str, Any]:
    return {"epoch": epoch, "holder": holder} if holder else {"epoch": epoch}


def _epoch(data: Any) -> int:
    epoch = data.get("epoch") if isinstance(data, dict) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise BadRecord("epoch", 'an epoch value is {"epoch": INTEGER >= 0}')
    return epoch


class StateStore:
    def __init__(
        self,
        settings: ServiceSettings,
        *,
        topic: str = STATE_TOPIC,
        admin: AdminClient | None = None,
        epoch_write_timeout: float = DEFAULT_EPOCH_WRITE_TIMEOUT,
        transactional_id: str | None = None,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.topic = topic
        self.epoch_write_timeout = epoch_write_timeout
        # Replication left to the cluster: 3 replicas, min.insync.replicas 2 where it can.
        self._topic = CompactedTopic(
            settings,
            topic,
            client_id="ds-assigner-state",
            admin=admin,
            producer_overrides={"linger.ms": 2},
        )
        # Fenced writes: only the term opened last (the current leader's) can write.
        self._writer = (
            None
            if transactional_id is None
            else TransactionalWriter(
                settings,
                topic,
                transactional_id=transactional_id,
                client_id="ds-assigner-state",
                on_lost=on_lost,
                overrides={"linger.ms": 2},
            )
        )

    # ---- setup and load (blocking: call through asyncio.to_thread) ----------------------

    def ensure_topic(self) -> None:
        self._topic.ensure()

    def begin_term(self) -> None:
        """On election, before :meth:`load`: take the state topic's transactional id, so
        every earlier leader's writes are fenced and its open transaction aborted (what
        :meth:`load` then reads is final). No-op without a transactional id."""
        if self._writer is not None:
            self._writer.open_term()

    def end_term(self) -> None:
        """On stepping down: no write of this replica goes out any more."""
        if self._writer is not None:
            self._writer.close_term()

    def load(self) -> StateSnapshot:
        """Read the whole topic, from the beginning to the high watermark."""
        snapshot = StateSnapshot()
        self._topic.load(lambda record: apply_record(snapshot, record.key, record.value))
        log.info(
            "state loaded",
            records=snapshot.records,
            bad_records=sum(snapshot.bad_records.values()),
            groups=len(snapshot.groups),
            epochs=sum(len(e) for e in snapshot.epochs.values()),
        )
        return snapshot

    # ---- writes -----------------------------------------------------------------------

    def put_group(self, record: GroupRecord) -> asyncio.Future[None]:
        return self._write([(_key("group", record.name), json.dumps(record.to_json()).encode())])

    def delete_group(
        self, group: str, clients: Iterable[str], drained: Iterable[str]
    ) -> asyncio.Future[None]:
        """DeleteGroup, in one write: tombstones for the group's bindings and drains, then
        for the group itself (its epochs are kept)."""
        records: list[tuple[bytes, bytes | None]] = [
            (_key("binding", group, c), None) for c in sorted(clients)
        ]
        records += [(_key("drain", group, s), None) for s in sorted(drained)]
        records.append((_key("group", group), None))
        return self._write(records)

    def put_epochs(
        self,
        group: str,
        epochs: Iterable[tuple[TP, int]],
        holders: Mapping[TP, str] | None = None,
    ) -> asyncio.Future[None]:
        """Resolves once durable; fails after ``epoch_write_timeout`` (the grant waiting
        for it is then taken back, never sent). ``holders``: the member each epoch is
        granted to, kept with it (only that member adopts it after a restart)."""
        return self._write(
            [
                (
                    _key("epoch", group, tp.topic, tp.partition),
                    json.dumps(_epoch_value(e, (holders or {}).get(tp))).encode(),
                )
                for tp, e in epochs
            ],
            timeout=self.epoch_write_timeout,
        )

    def confirm_term(self, leader: str, timeout: float) -> asyncio.Future[None]:
        """A write only the current term can make (fenced writes): resolves once
        committed; fails with ``Fenced`` once a newer leader opened its term."""
        return self._write([(_key("term"), json.dumps({"leader": leader}).encode())], timeout)

    def put_binding(self, group: str, client_id: str) -> asyncio.Future[None]:
        return self._write([(_key("binding", group, client_id), b'{"bound":true}')])

    def delete_binding(self, group: str, client_id: str) -> asyncio.Future[None]:
        return self._write([(_key("binding", group, client_id), None)])

    def put_drain(self, group: str, sidecar_id: str, drained: bool) -> asyncio.Future[None]:
        value = b'{"drained":true}' if drained else None
        return self._write([(_key("drain", group, sidecar_id), value)])

    def _write(
        self, records: list[tuple[bytes, bytes | None]], timeout: float = WRITE_TIMEOUT_SECONDS
    ) -> asyncio.Future[None]:
        """Produce records now; the future resolves when Kafka acknowledged all of them."""
        written = (
            self._topic.produce(records, timeout=timeout)
            if self._writer is None
            else self._writer.produce(records, timeout=timeout)
        )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(future: asyncio.Future[list[int]]) -> None:
            # Read the outcome even when nobody waits any more (the caller timed out and
            # cancelled ``done``): else asyncio logs "Future exception was never retrieved".
            error = None if future.cancelled() else future.exception()
            if done.done():
                return
            if future.cancelled():
                done.cancel()
            elif error is not None:
                done.set_exception(error)
            else:
                done.set_result(None)

        written.add_done_callback(settle)
        return done

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._topic.close(flush_timeout=10)


def _apply_membership(
    sets: dict[str, set[str]], parts: list[Any], value: bytes | None, kind: str
) -> None:
    """A ``[kind, group, name]`` record whose presence is the fact (a bound client, a
    drained sidecar): a value adds ``name`` to its group's set, a tombstone removes it."""
    group, name = _names(parts, 3, kind)
    if value is not None:
        _json(value, kind, "value")  # its content carries nothing; it must still parse
    members = sets.setdefault(str(group), set())
    if value is None:
        members.discard(str(name))
    else:
        members.add(str(name))
