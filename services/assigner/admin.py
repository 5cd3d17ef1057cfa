"""The admin API's logic: request validation, update masks, idempotency, paging, offsets.

:class:`~services.assigner.rpc.AdminServicer` is the thin gRPC adapter over this module.
The pure parts (validation, :func:`apply_update_mask`, :class:`IdempotencyCache`,
:class:`PageTokens`, :func:`lag_records`) take their clock as a parameter and do no I/O.
:class:`KafkaOffsets` is the Kafka edge: blocking confluent-kafka calls, meant to run in a
worker thread (``asyncio.to_thread``), never on the event loop.

Documented limits, until durable assigner state (issue 3) lands:

* request_ids (AIP-155) are remembered in memory for :data:`IDEMPOTENCY_TTL_SECONDS`; they do
  not survive an assigner restart or failover. Only successful responses are remembered: a
  retry of a failed request runs again.
* page tokens are signed with a per-process key: a token issued before a restart is refused
  (INVALID_ARGUMENT), and the client starts again from the first page.
* ``lag_seconds`` is the age of the record at the committed offset (the oldest unconsumed
  one): its timestamp is read once with a short-lived consumer (``assign()``, never commits)
  and remembered per (partition, offset), since it never changes. DescribeGroup waits for a
  probe only briefly (and one probe runs at a time, at most every 2 s); a partition whose
  record was not read yet, or carries no timestamp, reports -1 (unknown).
* DescribeGroup's committed and end offsets are at most 1 s old: concurrent and repeated
  calls share one Kafka read per group per second, so polling it costs Kafka nothing more.
* ListGroups computes ``total_lag`` live for the groups of the page (one committed-offsets
  request per group, one end-offsets request per partition, within one deadline); when
  Kafka cannot answer in time it reports -1 (unknown) instead of failing the listing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from google.protobuf import duration_pb2, field_mask_pb2, message, timestamp_pb2

from dataservice.assigner.v1 import types_pb2
from dataservice.common.v1 import common_pb2
from services.assigner.balancer import TopicPartition
from services.assigner.state import GroupRecord
from services.runtime.errors import DsError, Reason, invalid
from services.runtime.kafka import is_retriable, new_consumer
from services.runtime.settings import ServiceSettings

M = TypeVar("M", bound=message.Message)

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
IDEMPOTENCY_TTL_SECONDS = 600.0
IDEMPOTENCY_MAX_ENTRIES = 10_000
KAFKA_TIMEOUT_SECONDS = 5.0
LAG_PROBE_SECONDS = 2.0
LAG_PROBE_MAX_PARTITIONS = 256
# Groups whose committed-offsets consumer is kept open between reads (least recently read
# closed first): the assigner's groups, and a ListGroups page's, stay warm.
COMMITTED_READERS_KEPT = 128
# Pause before asking again after a retriable error (the coordinator is being re-found).
COMMITTED_RETRY_SECONDS = 0.1
# DescribeGroup may be polled many times a second (tests watch handoffs that way): offsets
# are read at most once per OFFSETS_MAX_AGE per group, and a new lag_seconds probe starts at
# most once per LAG_PROBE_INTERVAL.
OFFSETS_MAX_AGE_SECONDS = 1.0
LAG_PROBE_INTERVAL_SECONDS = 2.0
RECORD_TIMESTAMPS_KEPT = 100_000

# Kafka's own rules for group ids we accept (a group name is its Kafka group id) and for
# topic names (kafka.common.internals.Topic: legal chars, at most 249).
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Properties the mesh owns: the group id is the group's name, and commits must stay explicit
# and epoch-fenced (ARCHITECTURE §3), so neither may be set per group.
FORBIDDEN_CONSUMER_KEYS = frozenset({"group.id", "enable.auto.commit"})
MAX_TOPICS = 1000
MAX_CONSUMER_CONFIG = 200
MAX_ALERT_TEMPLATE = 255
# Same bounds as the assigner-wide settings (services/assigner/settings.py).
LEASE_TTL_RANGE = (0.5, 300.0)
HEARTBEAT_RANGE = (0.05, 60.0)

MODES: Mapping[int, str] = {
    common_pb2.GROUP_MODE_LEASED: "leased",
    common_pb2.GROUP_MODE_KAFKA_GROUP: "kafka_group",
}
BALANCE_STRATEGIES: Mapping[int, str] = {
    types_pb2.BALANCE_STRATEGY_UNSPECIFIED: "count",
    types_pb2.BALANCE_STRATEGY_COUNT: "count",
    types_pb2.BALANCE_STRATEGY_LOAD: "load",
}
# update_mask paths of GroupConfig that UpdateGroup may change.
MUTABLE_PATHS = (
    "topics",
    "mode",
    "consumer_config",
    "alert_template",
    "lease_ttl",
    "heartbeat_interval",
    "balance_strategy",
)
IMMUTABLE_PATHS = frozenset({"name", "config_version"})


def version_conflict(group: str, expected: int, current: int) -> DsError:
    return DsError(
        Reason.CONFIG_VERSION_CONFLICT,
        f"group {group!r} is at config_version {current}, not {expected}: read it again and retry",
        metadata={"group": group, "expected": str(expected), "current": str(current)},
    )


# ---- validation (pure) -------------------------------------------------------------------


def validate_group_name(field: str, name: str) -> str:
    if not name:
        raise invalid(field, "must not be empty")
    if not _NAME.match(name):
        raise invalid(field, "a group name is a Kafka group id: at most 249 of A-Z a-z 0-9 . _ -")
    return name


def validate_request_id(request_id: str) -> str:
    if request_id and not _REQUEST_ID.match(request_id):
        raise invalid("request_id", "must be a UUID (at most 128 of A-Z a-z 0-9 . _ : -)")
    return request_id


def validate_topics(field: str, topics: Sequence[str]) -> None:
    if not topics:
        raise invalid(field, "name at least one topic")
    if len(topics) > MAX_TOPICS:
        raise invalid(field, f"at most {MAX_TOPICS} topics")
    seen: set[str] = set()
    for i, topic in enumerate(topics):
        if not _NAME.match(topic) or topic in (".", ".."):
            raise invalid(f"{field}[{i}]", f"{topic!r} is not a valid Kafka topic name")
        if topic in seen:
            raise invalid(f"{field}[{i}]", f"topic {topic!r} is named twice")
        seen.add(topic)


def validate_consumer_config(field: str, config: Mapping[str, str]) -> None:
    """The mesh's rules for per-group librdkafka properties (what librdkafka itself
    accepts is checked by :func:`check_librdkafka_properties`)."""
    if len(config) > MAX_CONSUMER_CONFIG:
        raise invalid(field, f"at most {MAX_CONSUMER_CONFIG} properties")
    for key in sorted(config):
        if key in FORBIDDEN_CONSUMER_KEYS:
            raise DsError(
                Reason.INVALID_FIELD,
                f"{field}: {key!r} is set by the mesh and cannot be configured per group",
                metadata={"field": field, "key": key},
            )
        if not key or len(key) > 255 or key != key.strip():
            raise DsError(
                Reason.INVALID_FIELD,
                f"{field}: {key!r} is not a property name",
                metadata={"field": field, "key": key},
            )


def check_librdkafka_properties(field: str, config: Mapping[str, str]) -> None:
    """Unknown properties and bad values, as librdkafka judges them. Builds (and closes) a
    consumer that connects nowhere: a few milliseconds, but a C call — run it in a thread."""
    try:
        Consumer({**config, "group.id": "ds-assigner-config-check", "log_level": 0}).close()
    except KafkaException as exc:
        err = exc.args[0]
        text = err.str() if hasattr(err, "str") else str(exc)
        key = next((k for k in sorted(config) if f'"{k}"' in text or f"`{k}`" in text), "")
        raise DsError(
            Reason.INVALID_FIELD,
            f"{field}: {text}",
            metadata={"field": field, "key": key} if key else {"field": field},
        ) from exc


def seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def validate_timing(
    cfg: types_pb2.GroupConfig, default_ttl: float, default_heartbeat: float
) -> tuple[float, float]:
    """The group's effective (lease_ttl, heartbeat_interval), both checked."""
    ttl = seconds(cfg.lease_ttl) if cfg.HasField("lease_ttl") else default_ttl
    heartbeat = (
        seconds(cfg.heartbeat_interval) if cfg.HasField("heartbeat_interval") else default_heartbeat
    )
    if not LEASE_TTL_RANGE[0] <= ttl <= LEASE_TTL_RANGE[1]:
        raise invalid("group.lease_ttl", f"must be within {LEASE_TTL_RANGE} seconds")
    if not HEARTBEAT_RANGE[0] <= heartbeat <= HEARTBEAT_RANGE[1]:
        raise invalid("group.heartbeat_interval", f"must be within {HEARTBEAT_RANGE} seconds")
    if heartbeat * 2 > ttl:
        raise invalid(
            "group.heartbeat_interval",
            "must be at most half of lease_ttl, or a single late heartbeat expires every lease",
        )
    return ttl, heartbeat


def validate_group_config(
    cfg: types_pb2.GroupConfig, default_ttl: float, default_heartbeat: float
) -> None:
    """A whole GroupConfig as CreateGroup receives it, or as UpdateGroup would leave it."""
    validate_group_name("group.name", cfg.name)
    validate_topics("group.topics", cfg.topics)
    if cfg.mode not in MODES:
        raise invalid("group.mode", "must be GROUP_MODE_LEASED or GROUP_MODE_KAFKA_GROUP")
    validate_consumer_config("group.consumer_config", cfg.consumer_config)
    if len(cfg.alert_template) > MAX_ALERT_TEMPLATE or (
        cfg.alert_template and not _NAME.match(cfg.alert_template)
    ):
        raise invalid("group.alert_template", "must be a template name (A-Z a-z 0-9 . _ -)")
    if cfg.balance_strategy not in BALANCE_STRATEGIES:
        raise invalid("group.balance_strategy", "unknown balance strategy")
    validate_timing(cfg, default_ttl, default_heartbeat)


def mask_paths(mask: field_mask_pb2.FieldMask | None) -> tuple[str, ...]:
    """The update_mask's paths, checked; an unset or empty mask means every mutable field."""
    if mask is None or not mask.paths:
        return MUTABLE_PATHS
    for path in mask.paths:
        if path in IMMUTABLE_PATHS:
            raise DsError(
                Reason.INVALID_FIELD,
                f"update_mask: {path!r} cannot change (name selects the group; "
                "config_version is output only)",
                metadata={"field": "update_mask", "path": path},
            )
        if path not in MUTABLE_PATHS:
            raise DsError(
                Reason.INVALID_FIELD,
                f"update_mask: unknown path {path!r}; mutable: {', '.join(MUTABLE_PATHS)}",
                metadata={"field": "update_mask", "path": path},
            )
    return tuple(dict.fromkeys(mask.paths))


def apply_update_mask(
    current: types_pb2.GroupConfig, patch: types_pb2.GroupConfig, paths: Iterable[str]
) -> types_pb2.GroupConfig:
    """``current`` with the fields in ``paths`` taken from ``patch``. Repeated and map fields
    are replaced as a whole; a message field unset in ``patch`` becomes unset (= default)."""
    result = types_pb2.GroupConfig()
    result.CopyFrom(current)
    for path in paths:
        if path == "topics":
            del result.topics[:]
            result.topics.extend(patch.topics)
        elif path == "consumer_config":
            result.consumer_config.clear()
            result.consumer_config.update(patch.consumer_config)
        elif path == "lease_ttl":
            result.ClearField("lease_ttl")
            if patch.HasField("lease_ttl"):
                result.lease_ttl.CopyFrom(patch.lease_ttl)
        elif path == "heartbeat_interval":
            result.ClearField("heartbeat_interval")
            if patch.HasField("heartbeat_interval"):
                result.heartbeat_interval.CopyFrom(patch.heartbeat_interval)
        else:
            setattr(result, path, getattr(patch, path))
    return result


def changed_paths(before: types_pb2.GroupConfig, after: types_pb2.GroupConfig) -> list[str]:
    a = types_pb2.GroupConfig()
    a.CopyFrom(before)
    b = types_pb2.GroupConfig()
    b.CopyFrom(after)
    a.config_version = b.config_version = 0
    return [path for path in MUTABLE_PATHS if _field_bytes(a, path) != _field_bytes(b, path)]


def _field_bytes(cfg: types_pb2.GroupConfig, path: str) -> bytes:
    only = types_pb2.GroupConfig()
    apply = apply_update_mask(only, cfg, [path])
    return apply.SerializeToString(deterministic=True)


# ---- GroupConfig -> GroupRecord ----------------------------------------------------------

# GroupRecord field -> the GroupConfig field it comes from (for error messages).
SEED_FIELD_PATHS: Mapping[str, str] = {
    "alert_template": "alert_template",
    "lease_ttl_seconds": "lease_ttl",
    "heartbeat_interval_seconds": "heartbeat_interval",
    "balance_strategy": "balance_strategy",
}


def record_fields(cfg: types_pb2.GroupConfig) -> dict[str, Any]:
    """A validated GroupConfig as GroupRecord fields (None = server default)."""
    return {
        "name": cfg.name,
        "topics": list(cfg.topics),
        "mode": MODES[cfg.mode],
        "consumer_config": dict(cfg.consumer_config),
        "alert_template": cfg.alert_template,
        "lease_ttl_seconds": seconds(cfg.lease_ttl) if cfg.HasField("lease_ttl") else None,
        "heartbeat_interval_seconds": (
            seconds(cfg.heartbeat_interval) if cfg.HasField("heartbeat_interval") else None
        ),
        "balance_strategy": BALANCE_STRATEGIES[cfg.balance_strategy],
    }


def make_record(fields: Mapping[str, Any], defaults: Mapping[str, Any]) -> GroupRecord:
    """The durable GroupRecord for ``fields`` (config_version left at its default). A field
    the record does not carry (yet) must hold its default: an explicit value the assigner
    cannot apply is refused, never silently dropped."""
    known = {f.name for f in dataclasses.fields(GroupRecord)}
    kwargs: dict[str, Any] = {}
    for key, value in fields.items():
        if key in known:
            if value is not None:
                kwargs[key] = value
        elif value not in (None, "", defaults.get(key, "")):
            path = SEED_FIELD_PATHS.get(key, key)
            raise invalid(
                f"group.{path}", "per-group values are not supported by this assigner yet"
            )
    return GroupRecord(**kwargs)


# ---- idempotency (AIP-155) ---------------------------------------------------------------


@dataclass
class _Entry:
    fingerprint: bytes
    response: message.Message
    stored_at: float


def fingerprint(rpc: str, request: message.Message) -> bytes:
    """What makes two requests "the same": the RPC and every field but request_id."""
    body = type(request)()
    body.CopyFrom(request)
    body.ClearField("request_id")
    return hashlib.sha256(
        rpc.encode() + b"\0" + body.SerializeToString(deterministic=True)
    ).digest()


class IdempotencyCache:
    """request_id -> the first successful response, for ``ttl`` seconds (in memory).

    A retry with the same request_id and the same body gets the stored response without the
    change being applied again; the same request_id with another body is refused
    (INVALID_ARGUMENT). Concurrent calls with one request_id run the change once: the later
    ones wait for the first. Failures are not remembered, so a failed request may be retried.
    """

    def __init__(
        self,
        ttl: float = IDEMPOTENCY_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = IDEMPOTENCY_MAX_ENTRIES,
    ) -> None:
        self.ttl = ttl
        self.clock = clock
        self.max_entries = max_entries
        self._entries: dict[str, _Entry] = {}
        self._inflight: dict[str, tuple[bytes, asyncio.Future[message.Message]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, request_id: str, print_: bytes) -> message.Message | None:
        self._expire()
        entry = self._entries.get(request_id)
        if entry is None:
            return None
        if entry.fingerprint != print_:
            raise reused_request_id(request_id)
        return entry.response

    def store(self, request_id: str, print_: bytes, response: message.Message) -> None:
        self._expire()
        while len(self._entries) >= self.max_entries:
            self._entries.pop(next(iter(self._entries)))  # oldest first (insertion order)
        self._entries[request_id] = _Entry(print_, response, self.clock())

    def _expire(self) -> None:
        cutoff = self.clock() - self.ttl
        for request_id in [r for r, e in self._entries.items() if e.stored_at <= cutoff]:
            del self._entries[request_id]

    async def run(
        self, rpc: str, request: message.Message, request_id: str, call: Callable[[], Awaitable[M]]
    ) -> M:
        """``call()`` at most once per (request_id, body) within the TTL."""
        if not validate_request_id(request_id):
            return await call()
        print_ = fingerprint(rpc, request)
        stored = self.lookup(request_id, print_)
        if stored is not None:
            return _copy(stored)  # type: ignore[return-value]
        inflight = self._inflight.get(request_id)
        if inflight is not None:
            if inflight[0] != print_:
                raise reused_request_id(request_id)
            return _copy(await asyncio.shield(inflight[1]))  # type: ignore[return-value]
        future: asyncio.Future[message.Message] = asyncio.get_running_loop().create_future()
        self._inflight[request_id] = (print_, future)
        try:
            response = await call()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            del self._inflight[request_id]
        self.store(request_id, print_, _copy(response))
        future.set_result(response)
        return response


def reused_request_id(request_id: str) -> DsError:
    return DsError(
        Reason.INVALID_FIELD,
        "request_id: already used for a different request; use a new request_id",
        metadata={"field": "request_id", "request_id": request_id},
    )


def _copy(response: M) -> M:
    copy = type(response)()
    copy.CopyFrom(response)
    return copy


# ---- paging (AIP-158) --------------------------------------------------------------------


class PageTokens:
    """Opaque page tokens naming the last group of the previous page, HMAC-signed so that
    only tokens this process issued are accepted."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def issue(self, after: str) -> str:
        body = after.encode()
        mac = hmac.new(self._key, body, hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(mac + body).decode().rstrip("=")

    def parse(self, token: str) -> str:
        """The name after which the page starts; "" for the first page."""
        if not token:
            return ""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError) as exc:
            raise invalid("page_token", "not a token this service issued") from exc
        mac, body = raw[:16], raw[16:]
        if len(mac) < 16 or not hmac.compare_digest(
            mac, hmac.new(self._key, body, hashlib.sha256).digest()[:16]
        ):
            raise invalid(
                "page_token", "not a token this service issued (or issued before a restart)"
            )
        return body.decode()


def page_size(requested: int) -> int:
    if requested < 0:
        raise invalid("page_size", "must be >= 0 (0 = server default)")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def page(names: Sequence[str], after: str, size: int) -> tuple[list[str], str]:
    """The names of one page (``names`` sorted) and the last name if more follow, else ""."""
    start = next((i for i, n in enumerate(names) if n > after), len(names)) if after else 0
    chosen = list(names[start : start + size])
    more = start + size < len(names)
    return chosen, (chosen[-1] if more and chosen else "")


# ---- offsets and lag ---------------------------------------------------------------------

NO_OFFSET = -1


@dataclass(frozen=True)
class PartitionOffsets:
    committed: int  # the group's committed offset (next to consume); -1 = none
    earliest: int  # log start offset
    end: int  # high watermark

    @property
    def lag(self) -> int:
        return lag_records(self.committed, self.earliest, self.end)


Offsets = dict[TopicPartition, PartitionOffsets]


def lag_records(committed: int, earliest: int, end: int) -> int:
    """Records not yet consumed: end - committed, or everything left in the log when
    nothing is committed (or the commit points below the log start, deleted by retention)."""
    start = committed if committed >= 0 else earliest
    return max(0, end - max(start, earliest))


def total_lag(offsets: Mapping[TopicPartition, PartitionOffsets]) -> int:
    return sum(o.lag for o in offsets.values())


def lag_seconds(lag: int, oldest_ms: int | None, now_wall: float) -> float:
    """Age of the oldest unconsumed record; 0 when caught up, -1 when unknown."""
    if lag == 0:
        return 0.0
    if oldest_ms is None:
        return -1.0
    return max(0.0, now_wall - oldest_ms / 1000.0)


def wall_timestamp(mono: float, now_mono: float, now_wall: float) -> timestamp_pb2.Timestamp:
    """A monotonic instant of this process as wall-clock time."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int((now_wall - (now_mono - mono)) * 1e9))
    return ts


class KafkaOffsets:
    """Reads a group's committed offsets and its partitions' log bounds from Kafka.

    Every method blocks (up to ``timeout``): call it through ``asyncio.to_thread``. One
    call's requests share one deadline; Kafka that cannot answer in time raises
    ``DsError(KAFKA_UNAVAILABLE)``.

    Committed offsets are read by a consumer whose ``group.id`` is the group, never by an
    AdminClient: see :meth:`_committed`. No consumer here subscribes (so none joins a
    group) or commits; all are used and closed under ``_lock``, one thread at a time.
    """

    def __init__(
        self, settings: ServiceSettings, *, timeout: float = KAFKA_TIMEOUT_SECONDS
    ) -> None:
        self.settings = settings
        self.timeout = timeout
        self._lock = threading.RLock()  # read_many holds it around _watermarks
        self._consumer: Consumer | None = None  # for watermarks
        self._readers: OrderedDict[str, Consumer] = OrderedDict()  # committed offsets, by group

    def read(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionOffsets]:
        result = self.read_many({group: partitions})[group]
        if isinstance(result, DsError):
            raise result
        return result

    def read_many(
        self, groups: Mapping[str, Sequence[TopicPartition]]
    ) -> dict[str, dict[TopicPartition, PartitionOffsets] | DsError]:
        """Offsets of several groups: each group's committed offsets, then the watermarks
        of all their partitions, within one deadline."""
        deadline = time.monotonic() + self.timeout
        all_tps = sorted({tp for tps in groups.values() for tp in tps})
        if not all_tps:
            return {g: {} for g in groups}
        out: dict[str, dict[TopicPartition, PartitionOffsets] | DsError] = {}
        committed: dict[str, dict[tuple[str, int], int]] = {}
        with self._lock:
            for group, tps in groups.items():
                try:
                    committed[group] = self._committed(group, tps, deadline) if tps else {}
                except KafkaException as exc:
                    out[group] = _unavailable(
                        f"cannot read committed offsets of group {group!r}: {_text(exc)}", group
                    )
            if not any(groups[g] for g in committed):
                return {group: out.get(group, {}) for group in groups}
            try:
                bounds = self._watermarks(all_tps, deadline)
            except KafkaException as exc:
                err = _unavailable(f"cannot read partition offsets from Kafka: {_text(exc)}")
                return {group: err if tps else {} for group, tps in groups.items()}
        for group, tps in groups.items():
            if group in out:
                continue
            out[group] = {
                tp: PartitionOffsets(
                    committed=committed[group].get(tp, NO_OFFSET),
                    earliest=bounds[tp][0],
                    end=bounds[tp][1],
                )
                for tp in tps
            }
        return {group: out[group] for group in groups}

    def _committed(
        self, group: str, tps: Sequence[TopicPartition], deadline: float
    ) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the group's committed offset; a partition without one is
        missing. Called under ``_lock``.

        Through a consumer of the group, not AdminClient.list_consumer_group_offsets: when
        an OffsetFetch is answered NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE, librdkafka
        (2.16 here; confluentinc/librdkafka#5040) asks the client's own consumer group to
        re-find its coordinator, and an AdminClient has none: a NULL dereference on its
        rdk:main thread, a SIGSEGV that kills the assigner. Kafka answers so whenever a
        group's coordinator is not where the client looked: on a fresh broker until
        __consumer_offsets is loaded (the first DescribeGroup), and on every coordinator
        move. A consumer has the group, re-finds the coordinator, and the read is asked
        again until ``deadline``.
        """
        reader = self._reader(group)
        request = [_ktp(tp) for tp in tps]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KafkaException(f"timed out reading the committed offsets of {group}")
            try:
                listed = reader.committed(request, timeout=left)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not (isinstance(error, KafkaError) and is_retriable(error)):
                    raise
                time.sleep(max(0.0, min(COMMITTED_RETRY_SECONDS, deadline - time.monotonic())))
                continue
            return {
                (ktp.topic, ktp.partition): (ktp.offset if ktp.offset >= 0 else NO_OFFSET)
                for ktp in listed
                if ktp.error is None
            }

    def _reader(self, group: str) -> Consumer:
        """The group's committed-offsets consumer, kept for the next read. Under ``_lock``."""
        reader = self._readers.pop(group, None)
        if reader is None:
            reader = new_consumer(self.settings, group=group, client_id="ds-assigner-offsets")
        self._readers[group] = reader  # the most recently read last
        while len(self._readers) > COMMITTED_READERS_KEPT:
            _, oldest = self._readers.popitem(last=False)
            oldest.close()
        return reader

    def _watermarks(
        self, tps: Sequence[TopicPartition], deadline: float
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(log start, high watermark) per partition. A consumer's watermark query rather
        than AdminClient.list_offsets: the assigner once died (segfault in rdk:main) around
        list_offsets on a fresh broker, most likely the OffsetFetch crash of
        :meth:`_committed` rather than list_offsets itself."""
        out: dict[TopicPartition, tuple[int, int]] = {}
        with self._lock:
            if self._consumer is None:
                self._consumer = new_consumer(
                    self.settings, group="ds-assigner-watermarks", client_id="ds-assigner-admin"
                )
            for tp in tps:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KafkaException(
                        f"timed out reading the end offset of {tp.topic}/{tp.partition}"
                    )
                marks = self._consumer.get_watermark_offsets(_ktp(tp), timeout=left, cached=False)
                if marks is None:
                    raise KafkaException(
                        f"timed out reading the end offset of {tp.topic}/{tp.partition}"
                    )
                out[tp] = (int(marks[0]), int(marks[1]))
        return out

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            while self._readers:
                self._readers.popitem()[1].close()

    def oldest_timestamps(
        self, starts: Mapping[TopicPartition, int], budget: float = LAG_PROBE_SECONDS
    ) -> dict[TopicPartition, int]:
        """Timestamp (ms) of the first record at or after each start offset, as far as a
        short-lived consumer can read them within ``budget``; it never commits and joins no
        group (``assign()``). Partitions not read in time are missing from the result."""
        wanted = dict(sorted(starts.items())[:LAG_PROBE_MAX_PARTITIONS])
        if not wanted:
            return {}
        consumer = new_consumer(
            self.settings,
            group="ds-assigner-lag-probe",
            client_id="ds-assigner-lag-probe",
            overrides={
                "max.partition.fetch.bytes": 65536,
                "fetch.wait.max.ms": 50,
                "enable.auto.offset.store": False,
            },
        )
        found: dict[TopicPartition, int] = {}
        try:
            consumer.assign([_ktp(tp, offset) for tp, offset in wanted.items()])
            deadline = time.monotonic() + budget
            while len(found) < len(wanted) and (left := deadline - time.monotonic()) > 0:
                for msg in consumer.consume(num_messages=500, timeout=min(left, 0.5)):
                    topic, partition = msg.topic(), msg.partition()
                    if msg.error() is not None or topic is None or partition is None:
                        continue
                    tp = TopicPartition(topic, partition)
                    if tp in found or tp not in wanted:
                        continue
                    kind, ts = msg.timestamp()
                    if kind != TIMESTAMP_NOT_AVAILABLE and ts >= 0:
                        found[tp] = ts
                    consumer.pause([_ktp(tp)])
        except KafkaException:
            pass  # what was read stays; the rest is unknown (-1)
        finally:
            consumer.close()
        return found


def _ktp(tp: TopicPartition, offset: int | None = None) -> KafkaTopicPartition:
    if offset is None:
        return KafkaTopicPartition(tp.topic, tp.partition)
    return KafkaTopicPartition(tp.topic, tp.partition, offset)


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    return str(arg.str()) if hasattr(arg, "str") else str(arg)


def _unavailable(message: str, group: str = "") -> DsError:
    return DsError(Reason.KAFKA_UNAVAILABLE, message, metadata={"group": group} if group else None)


class OffsetsView:
    """What the event loop uses: :class:`KafkaOffsets` in worker threads, single-flight and
    briefly cached, every wait bounded by the caller's budget."""

    def __init__(
        self,
        reader: KafkaOffsets,
        *,
        max_age: float = OFFSETS_MAX_AGE_SECONDS,
        probe_interval: float = LAG_PROBE_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.max_age = max_age
        self.probe_interval = probe_interval
        self.clock = clock
        self._cached: dict[str, tuple[tuple[TopicPartition, ...], float, Offsets]] = {}
        self._reads: dict[str, asyncio.Task[Offsets]] = {}
        self._known: OrderedDict[tuple[TopicPartition, int], int] = OrderedDict()
        self._probe: asyncio.Task[None] | None = None
        self._next_probe = 0.0

    async def group(self, group: str, partitions: Sequence[TopicPartition], wait: float) -> Offsets:
        """The group's offsets, read at most ``max_age`` ago; KAFKA_UNAVAILABLE when Kafka
        does not answer within ``wait`` (or the read's own timeout)."""
        key = tuple(partitions)
        cached = self._cached.get(group)
        if cached is not None and cached[0] == key and self.clock() - cached[1] <= self.max_age:
            return cached[2]
        task = self._reads.get(group)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read(group, key))
            task.add_done_callback(_retrieve)
            self._reads[group] = task
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(wait, 0.0))
        except TimeoutError as exc:
            raise _unavailable(
                f"Kafka did not answer for the offsets of group {group!r} in time", group
            ) from exc

    async def _read(self, group: str, partitions: tuple[TopicPartition, ...]) -> Offsets:
        try:
            started = self.clock()
            value = await asyncio.to_thread(self.reader.read, group, partitions)
            self._cached[group] = (partitions, started, value)
            return value
        finally:
            self._reads.pop(group, None)

    async def many(
        self, groups: Mapping[str, Sequence[TopicPartition]], wait: float
    ) -> dict[str, Offsets | DsError]:
        """Offsets of several groups in one batch; a group not read within ``wait`` maps to
        a DsError (ListGroups reports its lag as unknown)."""
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self.reader.read_many, groups)
        )
        task.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(wait, 0.0))
        except TimeoutError:
            err = _unavailable("Kafka did not answer for the groups' offsets in time")
            return {g: err for g in groups}

    async def oldest_timestamps(
        self, starts: Mapping[TopicPartition, int], wait: float
    ) -> dict[TopicPartition, int]:
        """Timestamps (ms) of the records at ``starts``: the remembered ones, plus what a
        probe (started now if none ran within ``probe_interval``) reads within ``wait``."""
        missing = {tp: o for tp, o in starts.items() if (tp, o) not in self._known}
        if missing and self._probe is None and self.clock() >= self._next_probe:
            self._next_probe = self.clock() + self.probe_interval
            self._probe = asyncio.get_running_loop().create_task(self._run_probe(missing))
        if missing and self._probe is not None and wait > 0:
            await asyncio.wait({self._probe}, timeout=wait)
        return {tp: self._known[(tp, o)] for tp, o in starts.items() if (tp, o) in self._known}

    async def _run_probe(self, starts: Mapping[TopicPartition, int]) -> None:
        try:
            found = await asyncio.to_thread(self.reader.oldest_timestamps, starts)
            for tp, ts in found.items():
                self._known[(tp, starts[tp])] = ts
            while len(self._known) > RECORD_TIMESTAMPS_KEPT:
                self._known.popitem(last=False)
        except Exception:
            pass  # unknown stays -1; the next probe tries again
        finally:
            self._probe = None


def budget(time_remaining: float | None, cap: float, share: float = 0.5) -> float:
    """How long a step may wait: ``share`` of the call's remaining deadline, at most ``cap``."""
    if time_remaining is None:
        return cap
    return max(0.0, min(cap, time_remaining * share))


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shared task's outcome as seen even when every waiter gave up on it."""
    if not task.cancelled():
        task.exception()
