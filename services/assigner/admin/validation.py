"""Checks of the admin API's request fields and of whole ``GroupConfig`` messages (pure).

Each check raises ``DsError(INVALID_FIELD)`` naming the field (AIP-193); none does I/O.
What librdkafka itself accepts as a consumer property is checked apart, in
:mod:`.librdkafka`, since that needs a C call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from google.protobuf import duration_pb2

from dataservice.assigner.v1 import types_pb2
from dsclient.reasons import DsError, Reason, invalid
from services.assigner.group_timing import GroupTiming, check_group_timing
from services.runtime.consumer_config import ConsumerConfigError, check_allowed
from services.runtime.group_enums import (
    BALANCE_STRATEGIES,
    COMMIT_FENCINGS,
    EXTERNAL_OFFSET_CHANGES,
    MODES,
    ORDERINGS,
)

# Kafka's own rules for group ids we accept (a group name is its Kafka group id) and for
# topic names (kafka.common.internals.Topic: legal chars, at most 249).
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MAX_TOPICS = 1000
MAX_ALERT_TEMPLATE = 255
# Same bounds as the assigner-wide settings (services/assigner/settings.py).
LEASE_TTL_RANGE = (0.5, 300.0)
VISIBILITY_RANGE = (1.0, 43_200.0)  # seconds: 1 s to 12 h
MAX_DELIVERIES_RANGE = (-1, 1_000_000)  # -1: never give up; 0: the sidecars' default
HEARTBEAT_RANGE = (0.05, 60.0)


def version_conflict(group: str, expected: int, current: int) -> DsError:
    return DsError(
        Reason.CONFIG_VERSION_CONFLICT,
        f"group {group!r} is at config_version {current}, not {expected}: read it again and retry",
        metadata={"group": group, "expected": str(expected), "current": str(current)},
    )


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
    """The mesh's allow-list for per-group librdkafka properties
    (:func:`services.runtime.consumer_config.check_allowed`); what librdkafka itself accepts
    is checked by :func:`.librdkafka.check_librdkafka_properties`, only after this."""
    try:
        check_allowed(config)
    except ConsumerConfigError as err:
        raise consumer_config_error(field, err) from None


def consumer_config_error(field: str, err: ConsumerConfigError) -> DsError:
    """INVALID_FIELD naming the field and, in the message and metadata ``key``, the key."""
    metadata = {"field": field, "key": err.key} if err.key else {"field": field}
    return DsError(Reason.INVALID_FIELD, f"{field}: {err.message}", metadata=metadata)


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
    check_group_timing(
        GroupTiming(ttl, heartbeat),
        GroupTiming(default_ttl, default_heartbeat),
        COMMIT_FENCINGS.get(cfg.commit_fencing, ""),
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
    if cfg.external_offset_changes not in EXTERNAL_OFFSET_CHANGES:
        raise invalid(
            "group.external_offset_changes", "unknown value: expected follow, revert or ignore"
        )
    if cfg.ordering not in ORDERINGS:
        raise invalid(
            "group.ordering",
            f"unknown value {cfg.ordering}: expected ORDERING_UNORDERED, ORDERING_KEY or "
            "ORDERING_PARTITION",
        )
    if cfg.commit_fencing not in COMMIT_FENCINGS:
        raise invalid(
            "group.commit_fencing",
            f"unknown value {cfg.commit_fencing}: expected COMMIT_FENCING_LEASE or "
            "COMMIT_FENCING_KAFKA",
        )
    validate_timing(cfg, default_ttl, default_heartbeat)
    validate_redelivery(cfg)
    validate_dead_letter_topic(cfg)


def validate_dead_letter_topic(cfg: types_pb2.GroupConfig) -> None:
    """A legal Kafka topic name, and not one the group consumes (a record dead-lettered
    there would come back to the same group); empty: the sidecars' setting."""
    topic = cfg.dead_letter_topic
    if not topic:
        return
    if not _NAME.match(topic) or topic in (".", ".."):
        raise invalid("group.dead_letter_topic", f"{topic[:80]!r} is not a valid Kafka topic name")
    if topic in cfg.topics:
        raise invalid(
            "group.dead_letter_topic", f"{topic!r} is one of the group's topics; name another"
        )


def validate_redelivery(cfg: types_pb2.GroupConfig) -> None:
    """The group's visibility timeout and delivery limit, when set."""
    if cfg.HasField("visibility_timeout"):
        visibility = seconds(cfg.visibility_timeout)
        if not VISIBILITY_RANGE[0] <= visibility <= VISIBILITY_RANGE[1]:
            raise invalid("group.visibility_timeout", f"must be within {VISIBILITY_RANGE} seconds")
    if not MAX_DELIVERIES_RANGE[0] <= cfg.max_deliveries <= MAX_DELIVERIES_RANGE[1]:
        raise invalid(
            "group.max_deliveries",
            f"must be within {MAX_DELIVERIES_RANGE} (0: the default, -1: never give up)",
        )


def validate_commit_fencing_change(current: str, desired: str) -> None:
    """A live change of ``commit_fencing`` ("" = each sidecar's setting, which may be
    kafka) is safe only towards kafka. Each sidecar applies the group's value to the
    partitions granted from then on; a lease keeps the fencing it was granted under.
    lease -> kafka: the last lease-fenced holder stops at its local deadline before the
    assigner grants the partition again, as always; the Kafka-fenced next holder needs
    nothing of it. kafka -> lease: a lease-fenced holder does not initialise the lease's
    transactional id, so a Kafka-fenced holder that outlived its lease (it has no
    deadline) would not be fenced and could commit behind it. Refused."""
    if current == desired or desired == "kafka" or current == "lease":
        return
    before = current or "unspecified (the sidecars' setting, maybe kafka)"
    raise invalid(
        "group.commit_fencing",
        f"cannot change from {before} to {desired or 'unspecified'} live: a lease-fenced "
        "holder would not fence a Kafka-fenced one that outlived its lease "
        "(docs/operate/failure-model.md)",
    )
