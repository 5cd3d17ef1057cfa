"""The fault catalogue (ARCHITECTURE §5.4): what each fault type means, when it is raised,
which node reports it, how serious it is, when it resolves and how long its storms are
suppressed. The one place this is written down; the site's fault reference
(docs/reference/faults.md, scripts/gen_docs.py) is generated from the same data.

Pure data: no I/O. It lives in the shared layer because every service speaks it: the
reporter takes default severities from here, the notifier its suppression windows, every
emitter its dedupe keys, the assigner's UI and ``dsctl`` their short names and parsing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from dataservice.common.v1 import common_pb2

FaultTypeValue: TypeAlias = common_pb2.FaultType.ValueType
SeverityValue: TypeAlias = common_pb2.Severity.ValueType
OPEN = common_pb2.FAULT_STATE_OPEN
RESOLVED = common_pb2.FAULT_STATE_RESOLVED

# The default storm-suppression window (seconds) per type; a notifier setting overrides it.
DEFAULT_WINDOW_SECONDS = 10.0


@dataclass(frozen=True)
class FaultSpec:
    type: FaultTypeValue
    what: str  # definition
    when: str  # trigger
    who: str  # reporting node: "assigner", "sidecar" or "notifier"
    severity: SeverityValue
    resolved: str  # when the matching RESOLVED event is sent
    window_seconds: float = DEFAULT_WINDOW_SECONDS

    @property
    def name(self) -> str:
        """``CONSUMER_LOST`` for ``FAULT_TYPE_CONSUMER_LOST``."""
        return short_type(self.type)


T = common_pb2
CATALOGUE: Mapping[FaultTypeValue, FaultSpec] = {
    spec.type: spec
    for spec in (
        FaultSpec(
            T.FAULT_TYPE_CONSUMER_LOST,
            "A sidecar of the group died or was cut off without a Leave.",
            "No heartbeat from the sidecar for lease TTL + grace (SIGSTOP, partition), or its "
            "Session stream ended without a Leave and it did not attach again within the "
            "assigner's reconnect window, 1 s (kill -9: its kernel closes the socket).",
            "assigner",
            T.SEVERITY_ERROR,
            "The same sidecar id joins the group again.",
        ),
        FaultSpec(
            T.FAULT_TYPE_CONSUMER_LEFT,
            "A sidecar left the group gracefully (SIGTERM, scale-in).",
            "The sidecar's Leave (all its partitions handed off).",
            "assigner",
            T.SEVERITY_INFO,
            "The same sidecar id joins the group again.",
        ),
        FaultSpec(
            T.FAULT_TYPE_PARTITIONS_REASSIGNED,
            "Partitions of the group moved to other sidecars.",
            "The assigner granted partitions to a new holder after a loss, leave, "
            "hold-window expiry or MoveLease.",
            "assigner",
            T.SEVERITY_WARNING,
            "Every partition of the group is held again (sent with the reassignment when "
            "no partition is left unheld).",
        ),
        FaultSpec(
            T.FAULT_TYPE_CLIENT_REBOUND,
            "Application clients of the group were bound to a new set of sidecars.",
            "The sidecars serving the group changed (a sidecar lost, left or joined).",
            "assigner",
            T.SEVERITY_INFO,
            "Sent at once: the new binding is already pushed to the clients.",
        ),
        FaultSpec(
            T.FAULT_TYPE_ASSIGNER_FAILOVER,
            "A new assigner replica took over leadership.",
            "A replica won the leader election and loaded the state topic.",
            "assigner",
            T.SEVERITY_WARNING,
            "Sent once the new leader's settle period (TTL + grace) is over.",
        ),
        FaultSpec(
            T.FAULT_TYPE_CONFIG_REJECTED,
            "A sidecar could not apply the group's consumer config; it keeps running the "
            "config it had.",
            "A sidecar's heartbeat reports a config version it refused (librdkafka refused "
            "the properties there, or some are not allowed), with the reason.",
            "assigner",
            T.SEVERITY_WARNING,
            "The sidecar applies a later version of the group's config, or leaves the group.",
        ),
        FaultSpec(
            T.FAULT_TYPE_GROUP_DELETED,
            "A group was deleted (DeleteGroup); the audit record: who (attribute `actor`), "
            "whether it was forced (`forced`), the clients that were bound and lost their "
            "binding (`clients`, comma-separated) and the config version deleted "
            "(`config_version`).",
            "A DeleteGroup that removed the group.",
            "assigner",
            T.SEVERITY_WARNING,
            "Sent at once with the OPEN event: the group is gone when it is reported.",
            window_seconds=0.0,
        ),
        FaultSpec(
            T.FAULT_TYPE_COMMIT_FAILED,
            "Committing offsets to Kafka failed (acks recorded but not durable yet).",
            "A sidecar commit (ack-driven, revoke or explicit) raised a Kafka error.",
            "sidecar",
            T.SEVERITY_ERROR,
            "The next commit of the sidecar succeeds.",
        ),
        FaultSpec(
            T.FAULT_TYPE_BROKER_UNREACHABLE,
            "The sidecar cannot reach the Kafka brokers.",
            "librdkafka reports all brokers down or a transport failure.",
            "sidecar",
            T.SEVERITY_CRITICAL,
            "The sidecar's Kafka dependency check succeeds again.",
        ),
        FaultSpec(
            T.FAULT_TYPE_POISON_RECORD,
            "A record could not be read or delivered (corrupt, oversized, undecodable), or "
            "was delivered the group's max_deliveries times without an ack and is given up "
            "(the commit point passes it).",
            "The fetch loop gets a message-level error from Kafka for a partition, or a "
            "record comes due again after its last allowed delivery (the event names the "
            "partition and the offset).",
            "sidecar",
            T.SEVERITY_ERROR,
            "The partition delivers records again after the bad one.",
        ),
        FaultSpec(
            T.FAULT_TYPE_OFFSET_GAP,
            "Records of a partition were skipped: the sidecar's fetch position fell outside "
            "the partition's log (deleted by retention before they were read, or a "
            "truncated log), so fetching went on from the log start (or end).",
            "The fetch loop finds its position out of range (Kafka's offset reset, made "
            "explicit: the event names the partition and the offsets skipped).",
            "sidecar",
            T.SEVERITY_ERROR,
            "Sent at once: fetching goes on from the new position.",
        ),
        FaultSpec(
            T.FAULT_TYPE_CLIENT_BACKPRESSURE,
            "Clients do not keep up: partitions stop fetching on a full buffer.",
            "The fetch loop holds a partition back because the buffer reached the cap "
            "(paused past its share, or all held while the whole buffer is full).",
            "sidecar",
            T.SEVERITY_WARNING,
            "The partition fetches again (a delivery made room in the buffer).",
            window_seconds=30.0,
        ),
        FaultSpec(
            T.FAULT_TYPE_LAG_WARNING,
            "The group falls behind: offsets advance but lag does not decrease over the "
            "window (Burrow WARN), or lag is past the group's warning threshold.",
            "A lag evaluation of the group.",
            "notifier",
            T.SEVERITY_WARNING,
            "An evaluation finds no partition in WARN and lag under the warning threshold.",
        ),
        FaultSpec(
            T.FAULT_TYPE_LAG_ERROR,
            "Lag of the group is past its error threshold (records or seconds).",
            "A lag evaluation of the group.",
            "notifier",
            T.SEVERITY_ERROR,
            "An evaluation finds lag under the error threshold.",
        ),
        FaultSpec(
            T.FAULT_TYPE_LAG_STALLED,
            "The group commits, but the committed offset does not move while lag is non-zero "
            "(Burrow STALL).",
            "A lag evaluation finds a partition in STALL.",
            "notifier",
            T.SEVERITY_ERROR,
            "An evaluation finds no partition in STALL.",
        ),
        FaultSpec(
            T.FAULT_TYPE_LAG_STOPPED,
            "The group stopped committing while lag is non-zero (Burrow STOP).",
            "A lag evaluation finds a partition in STOP.",
            "notifier",
            T.SEVERITY_ERROR,
            "An evaluation finds no partition in STOP.",
        ),
        FaultSpec(
            T.FAULT_TYPE_LAG_REWOUND,
            "The committed offset of the group moved backwards (Burrow REWIND).",
            "A lag evaluation finds a partition in REWIND.",
            "notifier",
            T.SEVERITY_WARNING,
            "An evaluation finds no partition in REWIND.",
        ),
        FaultSpec(
            T.FAULT_TYPE_PROBE_LOST,
            "End-to-end delivery is broken: a probe record produced to the probe topic was "
            "not consumed through the mesh (probe group) in time.",
            "A probe is not received within the probe timeout (sidecar of the probe group "
            "stopped or cut off, assigner down, Kafka not delivering).",
            "notifier",
            T.SEVERITY_ERROR,
            "Every partition that lost a probe delivers a later probe within the timeout.",
        ),
        FaultSpec(
            T.FAULT_TYPE_OFFSETS_RESET,
            "The group's committed offsets were reset; the audit record: who (attribute "
            "`actor`), from where (`source`: admin, or external for a reset made with "
            "Kafka's tools), which partitions, and old and new offsets (`offsets`: "
            "`partition:old->new`, comma-separated; `epochs` for leased groups; for an "
            "external one, `actor` is what the commit's metadata says of its writer and "
            "`detected_by` the sidecars that noticed it, or `commit log`; `action: reverted` "
            "when the group's `external_offset_changes` is revert, offsets from the external "
            "one back to the mesh's).",
            "A ResetOffsets that committed new offsets, a reset made with Kafka's tools "
            "that the mesh followed (one event per topic), or one it reverted.",
            "assigner",
            T.SEVERITY_WARNING,
            "Sent at once with the OPEN event: the reset is complete when it is reported.",
            window_seconds=0.0,
        ),
        FaultSpec(
            T.FAULT_TYPE_TEMPLATE_FAILED,
            "An alert template was disabled: it exceeded a rendering limit (time, output "
            "size, memory) or its route is no longer allowed (attributes caller, template, "
            "why).",
            "Rendering an alert of the template, in the notifier's render worker.",
            "notifier",
            T.SEVERITY_ERROR,
            "The template is put again (PutAlertTemplate), which enables it.",
        ),
        FaultSpec(
            T.FAULT_TYPE_DEAD_LETTER,
            "An outbox item (a fault event or an alert) was refused for good by its "
            "destination and moved to the outbox's dead-letter table (attributes kind, "
            "destination, error); one event for the items of a webhook destination moved "
            "in bulk (attributes count, id and last_id: the first and the last).",
            "Kafka's producer refused the item outright (over message.max.bytes, a bad topic), "
            "the broker answered a permanent error, a webhook answered 4xx, or a webhook "
            "destination failed webhook_max_attempts attempts in a row (its waiting items, "
            "and after each later failed attempt those queued since), an item waited "
            "longer than webhook_max_age_seconds for a failing destination, or an alert "
            "came for a webhook destination already holding webhook_max_pending items "
            "(error: outbox full for this destination).",
            "notifier",
            T.SEVERITY_ERROR,
            "Sent at once: the item is out of the way (kept in the dead-letter table) and the "
            "items behind it are delivered.",
        ),
    )
}

_TYPE_PREFIX = "FAULT_TYPE_"
_SEVERITY_PREFIX = "SEVERITY_"
_STATE_PREFIX = "FAULT_STATE_"


def short_type(value: FaultTypeValue) -> str:
    return common_pb2.FaultType.Name(value).removeprefix(_TYPE_PREFIX)


def short_severity(value: SeverityValue) -> str:
    return common_pb2.Severity.Name(value).removeprefix(_SEVERITY_PREFIX)


def short_state(value: common_pb2.FaultState.ValueType) -> str:
    return common_pb2.FaultState.Name(value).removeprefix(_STATE_PREFIX)


def event_fields(event: common_pb2.FaultEvent) -> dict[str, Any]:
    """An event as plain fields with short enum names: what alert templates render and
    what ``dsctl faults --output json`` prints. ``detected_at`` is RFC 3339 UTC, or None."""
    return {
        "id": event.id,
        "type": short_type(event.type),
        "state": short_state(event.state),
        "severity": short_severity(event.severity),
        "source_service": event.source_service,
        "source_instance": event.source_instance,
        "group": event.group,
        "topic": event.topic,
        "partitions": list(event.partitions),
        "consumer_id": event.consumer_id,
        "client_id": event.client_id,
        "detected_at": event.detected_at.ToJsonString() if event.HasField("detected_at") else None,
        "message": event.message,
        "attributes": dict(sorted(event.attributes.items())),
        "dedupe_key": event.dedupe_key,
        "suppressed_count": event.suppressed_count,
    }


def parse_type(name: str) -> FaultTypeValue:
    """``LAG_ERROR`` or ``FAULT_TYPE_LAG_ERROR`` -> the enum value; ValueError otherwise."""
    upper = name.strip().upper()
    full = upper if upper.startswith(_TYPE_PREFIX) else _TYPE_PREFIX + upper
    try:
        value = common_pb2.FaultType.Value(full)
    except ValueError:
        raise ValueError(f"unknown fault type {name!r}") from None
    if value == common_pb2.FAULT_TYPE_UNSPECIFIED:
        raise ValueError("fault type must not be UNSPECIFIED")
    return value


def parse_severity(name: str) -> SeverityValue:
    upper = name.strip().upper()
    full = upper if upper.startswith(_SEVERITY_PREFIX) else _SEVERITY_PREFIX + upper
    try:
        return common_pb2.Severity.Value(full)
    except ValueError:
        raise ValueError(f"unknown severity {name!r}") from None


def dedupe_key(fault_type: FaultTypeValue, *coordinates: str) -> str:
    """The key that makes two reports "the same fault" for storm suppression and for
    matching a RESOLVED event to its OPEN one: the short type name, then the coordinates
    the emitter chose (``CONSUMER_LOST|group|sidecar``; the probe's omits its partitions,
    which may grow while the fault is open). Every emitter builds its keys here, so they
    all have one shape."""
    return "|".join((short_type(fault_type), *coordinates))


def default_dedupe_key(event: common_pb2.FaultEvent) -> str:
    """The key of a report that brings none: type and every coordinate it names.
    The state is not part of it, so a RESOLVED event carries its OPEN event's key."""
    return dedupe_key(
        event.type,
        event.group,
        event.topic,
        ",".join(str(p) for p in sorted(event.partitions)),
        event.consumer_id,
        event.client_id,
    )


def markdown_table() -> str:
    """The fault catalogue as a Markdown table (docs/reference/faults.md)."""
    lines = [
        "| fault | who | severity | what | when | resolved |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for spec in CATALOGUE.values():
        lines.append(
            f"| `{spec.name}` | {spec.who} | {short_severity(spec.severity)} | {spec.what} "
            f"| {spec.when} | {spec.resolved} |"
        )
    return "\n".join(lines)
