"""A group's ``consumer_config``: which librdkafka properties a group may set, what a change
costs a running sidecar, and librdkafka's own verdict on the values.

A group's config comes from whoever may call ``CreateGroup``/``UpdateGroup`` and ends up in
the librdkafka consumer of every sidecar of the group (ARCHITECTURE §8: nothing a caller
sends may redirect or break the mesh). So it is checked against an **allow-list**
(:data:`ALLOWED`): properties that tune how a consumer fetches, buffers, times out and
reconnects. Everything else is refused naming the key, with the reason
(:func:`refusal`): what changes where or as whom the sidecar connects
(``bootstrap.servers``, ``client.id``, ``security.*``, ``sasl.*``, ``ssl.*``, ...), what loads
code (``plugin.library.paths``, ``interceptors``, callbacks), and what the mesh sets itself
(``group.id``, ``enable.auto.commit``, the group protocol, statistics, logging). A few sizes
have a ceiling of the mesh's (:data:`LIMITS`), since they are memory a sidecar commits to.
Then the values are tried on a throw-away librdkafka configuration, on top of the
sidecar's own defaults (:func:`check_librdkafka`) — only ever after the allow-list: an
unchecked ``plugin.library.paths`` would make librdkafka ``dlopen()`` the caller's path.

**What a change costs** (:func:`plan`). librdkafka has no call that changes a property of a
running client (``rd_kafka_conf_set`` works on a configuration before ``rd_kafka_new``;
confluent-kafka's only runtime setter, ``set_sasl_credentials``, is for SASL, which a group
may not set). So every property a running consumer reads takes a new consumer instance,
which the sidecar builds in place (``consumer_sidecar/live_config.py``). The exception are
the group-membership timers (:data:`MEMBERSHIP_ONLY`): an ``assign()`` consumer (leased
mode) never joins a Kafka group and never reads them, so in leased mode they are recorded
without touching the consumer.

Pure, except :func:`check_librdkafka` (a C call that connects nowhere).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException

# What the sidecar's fetch consumer runs with whatever the group says (a group's
# consumer_config goes on top). Here, not in the sidecar, because the assigner checks a
# group's config on top of them: what it accepts is what a sidecar can build.
SIDECAR_CONSUMER_DEFAULTS: Mapping[str, object] = {
    # Keep librdkafka's own prefetch queue small: the sidecar's buffer is the real one
    # and must bound memory (backpressure pauses partitions past the cap).
    "queued.max.messages.kbytes": 8192,
    # One fetch response may not dwarf the cap either (librdkafka's default is 50 MiB).
    "fetch.max.bytes": 8 * 1024 * 1024,
    "fetch.wait.max.ms": 100,
    # With a queue that small, one fetch response fills it, and librdkafka then postpones
    # the partitions' next fetch by fetch.queue.backoff.ms (default 1000 ms): records/s
    # fell to a fifth. Fetch again as soon as the queue has drained below the threshold.
    "fetch.queue.backoff.ms": 10,
}

MAX_PROPERTIES = 200
MAX_VALUE_LENGTH = 255


class Apply(enum.Enum):
    """How a running sidecar takes a changed property."""

    NEW_CONSUMER = "new consumer instance"  # read by every consumer: replaced in place
    MEMBERSHIP_ONLY = "kafka_group membership"  # read only by a subscribe()d consumer


@dataclass(frozen=True)
class Property:
    """One property a group may set: what it is for, and an example value (tests and docs
    build a consumer with every example)."""

    name: str
    what: str
    example: str
    apply: Apply = Apply.NEW_CONSUMER


_P = Property
_MEMBERSHIP = Apply.MEMBERSHIP_ONLY
ALLOWED: Mapping[str, Property] = {
    p.name: p
    for p in (
        # Fetching.
        _P("fetch.max.bytes", "most bytes one fetch response may carry", "16777216"),
        _P("fetch.min.bytes", "least bytes a broker waits for before answering", "1"),
        _P("fetch.wait.max.ms", "how long a broker waits for fetch.min.bytes", "200"),
        _P("max.partition.fetch.bytes", "most bytes per partition in a fetch", "2097152"),
        _P("fetch.message.max.bytes", "alias of max.partition.fetch.bytes", "2097152"),
        _P("fetch.error.backoff.ms", "pause after a fetch error", "200"),
        _P("fetch.queue.backoff.ms", "pause when the prefetch queue is full", "50"),
        _P("queued.min.messages", "records librdkafka tries to keep prefetched", "20000"),
        _P("queued.max.messages.kbytes", "most KiB librdkafka keeps prefetched", "16384"),
        _P("receive.message.max.bytes", "largest response accepted", "33554432"),
        _P("isolation.level", "read_committed or read_uncommitted", "read_uncommitted"),
        _P("client.rack", "rack of the sidecar: fetch from the nearest replica", "eu-west-1a"),
        _P("check.crcs", "verify record CRCs (costs CPU)", "true"),
        _P("auto.offset.reset", "where a partition without commits starts", "earliest"),
        # Group membership (kafka_group mode only).
        _P("session.timeout.ms", "kafka_group: member expiry", "45000", _MEMBERSHIP),
        _P("heartbeat.interval.ms", "kafka_group: group heartbeats", "3000", _MEMBERSHIP),
        _P("max.poll.interval.ms", "kafka_group: poll deadline", "300000", _MEMBERSHIP),
        _P("coordinator.query.interval.ms", "how often the coordinator is looked up", "600000"),
        # Connections, retries and metadata (to the same brokers, as the same client).
        _P("socket.timeout.ms", "network request timeout", "60000"),
        _P("socket.connection.setup.timeout.ms", "connection setup timeout", "30000"),
        _P("socket.keepalive.enable", "TCP keep-alive", "true"),
        _P("socket.nagle.disable", "TCP_NODELAY", "true"),
        _P("socket.send.buffer.bytes", "socket send buffer (0 = system default)", "0"),
        _P("socket.receive.buffer.bytes", "socket receive buffer (0 = system default)", "0"),
        _P("socket.max.fails", "send failures before a connection is closed", "3"),
        _P("connections.max.idle.ms", "close idle connections after this long", "600000"),
        _P("reconnect.backoff.ms", "first reconnect delay", "100"),
        _P("reconnect.backoff.max.ms", "longest reconnect delay", "10000"),
        _P("retry.backoff.ms", "first retry delay", "100"),
        _P("retry.backoff.max.ms", "longest retry delay", "1000"),
        _P("broker.address.ttl", "how long resolved broker addresses are cached", "1000"),
        _P("metadata.max.age.ms", "metadata cache expiry", "900000"),
        _P("topic.metadata.refresh.interval.ms", "periodic metadata refresh", "60000"),
        _P("topic.metadata.refresh.fast.interval.ms", "refresh while a leader is missing", "100"),
        _P("topic.metadata.refresh.sparse", "fewer metadata requests", "true"),
        _P("topic.metadata.propagation.max.ms", "wait for a new topic's metadata", "30000"),
    )
}
MEMBERSHIP_ONLY = frozenset(k for k, p in ALLOWED.items() if p.apply is Apply.MEMBERSHIP_ONLY)

# Ceilings of the mesh on sizes a sidecar commits memory to (librdkafka's own ranges are far
# wider): the buffer cap bounds what clients have not read yet; these bound the rest.
LIMITS: Mapping[str, int] = {
    "fetch.max.bytes": 256 * 1024 * 1024,
    "max.partition.fetch.bytes": 64 * 1024 * 1024,
    "fetch.message.max.bytes": 64 * 1024 * 1024,
    "receive.message.max.bytes": 256 * 1024 * 1024 + 512,
    "queued.max.messages.kbytes": 256 * 1024,
}

_CONNECTS = "changes where or as whom the sidecar connects"
_LOADS_CODE = "loads code into the sidecar"
_MESH_OWNED = "is set by the mesh"
# Families of refused properties (prefixes), and single ones, with the reason a refusal
# names. Anything else that is not in ALLOWED is refused as "not on the allow-list".
_REFUSED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("security.", _CONNECTS),
    ("sasl.", _CONNECTS),
    ("ssl.", _CONNECTS),
    ("ssl_", _CONNECTS),
    ("https.", _CONNECTS),
    ("enable.ssl.", _CONNECTS),
    ("enable.sasl.", _CONNECTS),
    ("group.", _MESH_OWNED),
    ("api.version.", _MESH_OWNED),
    ("client.software.", _MESH_OWNED),
    ("log", _MESH_OWNED),  # log_level, log.queue, log.thread.name, logger, ...
)
_REFUSED: Mapping[str, str] = {
    "bootstrap.servers": _CONNECTS,
    "metadata.broker.list": _CONNECTS,
    "client.id": _CONNECTS,
    "client.dns.lookup": _CONNECTS,
    "broker.address.family": _CONNECTS,
    "plugin.library.paths": _LOADS_CODE,
    "interceptors": _LOADS_CODE,
    "opaque": _LOADS_CODE,
    "enable.auto.commit": _MESH_OWNED,
    "auto.commit.enable": _MESH_OWNED,
    "auto.commit.interval.ms": _MESH_OWNED,
    "enable.auto.offset.store": _MESH_OWNED,
    "enable.partition.eof": _MESH_OWNED,
    "partition.assignment.strategy": _MESH_OWNED,
    "statistics.interval.ms": _MESH_OWNED,
    "debug": _MESH_OWNED,
    "allow.auto.create.topics": _MESH_OWNED,
    "offset.store.method": _MESH_OWNED,
}


class ConsumerConfigError(ValueError):
    """A group config a sidecar must not run: ``key`` names the property ('' when the
    problem is the whole config)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


def refusal(key: str) -> str | None:
    """Why a group may not set ``key``, or None if it may (pure)."""
    if key in ALLOWED:
        return None
    if key.endswith("_cb"):
        return _LOADS_CODE  # a callback: code, and not a string anyway
    reason = _REFUSED.get(key)
    if reason is None:
        reason = next((r for prefix, r in _REFUSED_PREFIXES if key.startswith(prefix)), None)
    if reason is not None:
        return f"{reason} and cannot be set per group"
    return "is not a property a group may set (see the allow-list in the README)"


def check_allowed(config: Mapping[str, str]) -> None:
    """The mesh's rules, pure: at most :data:`MAX_PROPERTIES` properties, each on the
    allow-list, each value a short string within the mesh's :data:`LIMITS`. Raises
    :class:`ConsumerConfigError` for the first problem in key order."""
    if len(config) > MAX_PROPERTIES:
        raise ConsumerConfigError("", f"at most {MAX_PROPERTIES} properties")
    for key in sorted(config):
        value = config[key]
        if not key or len(key) > MAX_VALUE_LENGTH or key != key.strip():
            raise ConsumerConfigError(key, f"{key!r} is not a property name")
        if (why := refusal(key)) is not None:
            raise ConsumerConfigError(key, f"{key!r} {why}")
        if len(value) > MAX_VALUE_LENGTH or not value.isprintable():
            raise ConsumerConfigError(
                key, f"{key!r}: the value must be printable and at most {MAX_VALUE_LENGTH} long"
            )
        limit = LIMITS.get(key)
        digits = value.strip()
        if limit is not None and digits.isascii() and digits.isdigit() and int(digits) > limit:
            raise ConsumerConfigError(key, f"{key!r}: at most {limit} in a group's config")


def check_librdkafka(
    config: Mapping[str, str], base: Mapping[str, object] = SIDECAR_CONSUMER_DEFAULTS
) -> None:
    """Unknown properties and bad values as librdkafka judges them, ``config`` on top of
    ``base``: builds (and closes) a consumer that connects nowhere. A few milliseconds, but
    a C call: run it in a thread. Call only with a config :func:`check_allowed` passed.
    Raises :class:`ConsumerConfigError` naming the key librdkafka names, if any."""
    try:
        Consumer({**base, **config, "group.id": "ds-config-check", "log_level": 0}).close()
    except KafkaException as exc:
        text = kafka_error_text(exc)
        key = next((k for k in sorted(config) if f'"{k}"' in text or f"`{k}`" in text), "")
        raise ConsumerConfigError(key, text) from exc


def kafka_error_text(exc: KafkaException) -> str:
    """librdkafka's own words for a refused configuration, without confluent-kafka's prefix."""
    error = exc.args[0] if exc.args else None
    text = error.str() if isinstance(error, KafkaError) else str(exc)
    return text.removeprefix("Failed to create consumer: ")


def validate(
    config: Mapping[str, str], base: Mapping[str, object] = SIDECAR_CONSUMER_DEFAULTS
) -> None:
    """:func:`check_allowed`, then :func:`check_librdkafka` (never the other way round)."""
    check_allowed(config)
    check_librdkafka(config, base)


@dataclass(frozen=True)
class ConfigChange:
    """What changes from one group config to the next, and whether a running consumer must
    be replaced to take it (:func:`plan`)."""

    added: Mapping[str, str]
    changed: Mapping[str, tuple[str, str]]  # key -> (old, new)
    removed: Mapping[str, str]
    new_consumer: bool

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.added) | frozenset(self.changed) | frozenset(self.removed)

    @property
    def empty(self) -> bool:
        return not self.keys


def plan(old: Mapping[str, str], new: Mapping[str, str], *, kafka_group: bool) -> ConfigChange:
    """The change from ``old`` to ``new`` (pure). A subscribe()d consumer (kafka_group)
    reads every property; an assign()ed one (leased) all but :data:`MEMBERSHIP_ONLY`. A
    removed property changes the consumer as much as a changed one: it falls back to the
    sidecar's default."""
    added = {k: v for k, v in new.items() if k not in old}
    removed = {k: v for k, v in old.items() if k not in new}
    changed = {k: (old[k], v) for k, v in new.items() if k in old and old[k] != v}
    keys = set(added) | set(removed) | set(changed)
    read = keys if kafka_group else keys - MEMBERSHIP_ONLY
    return ConfigChange(added, changed, removed, new_consumer=bool(read))
