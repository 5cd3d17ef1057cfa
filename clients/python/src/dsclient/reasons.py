"""The one catalogue of error reasons, and how they travel as gRPC statuses (AIP-193).

Every error a service returns is a canonical gRPC status code plus a ``google.rpc.ErrorInfo``
detail whose ``reason`` is one of :class:`Reason`, ``domain`` is ``"dataservice"`` and whose
``metadata`` carries the dynamic values (the group, the offending field, the leader address).
Servicers raise :class:`DsError`; the servers' ``ErrorInterceptor``
(``services/runtime/error_interceptor.py``) turns it into the status, so handler code never
builds statuses by hand. Clients read it back with :func:`error_info`.
The site's error reference (docs/reference/errors.md) is generated from :data:`CATALOGUE`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import StrEnum

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

DOMAIN = "dataservice"
# Trailing metadata key a follower assigner uses to name the current leader (§3).
LEADER_METADATA_KEY = "ds-leader"
# Where gRPC carries the serialized google.rpc.Status (with its details) of a failed call.
_STATUS_DETAILS_KEY = "grpc-status-details-bin"


class Reason(StrEnum):
    """Why a call failed. The value is the ErrorInfo ``reason``; see :data:`CATALOGUE`."""

    INVALID_FIELD = "INVALID_FIELD"
    GROUP_NOT_FOUND = "GROUP_NOT_FOUND"
    GROUP_ALREADY_EXISTS = "GROUP_ALREADY_EXISTS"
    TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
    SIDECAR_NOT_FOUND = "SIDECAR_NOT_FOUND"
    GROUP_NOT_SERVED = "GROUP_NOT_SERVED"
    NOT_LEADER = "NOT_LEADER"
    SESSION_NOT_JOINED = "SESSION_NOT_JOINED"
    LEASE_NOT_HELD = "LEASE_NOT_HELD"
    LEASE_EPOCH_STALE = "LEASE_EPOCH_STALE"
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
    GROUP_MODE_MISMATCH = "GROUP_MODE_MISMATCH"
    CONFIG_VERSION_CONFLICT = "CONFIG_VERSION_CONFLICT"
    KAFKA_UNAVAILABLE = "KAFKA_UNAVAILABLE"
    SERVICE_NOT_READY = "SERVICE_NOT_READY"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    ALERT_TEMPLATE_NOT_FOUND = "ALERT_TEMPLATE_NOT_FOUND"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    SESSION_HELD = "SESSION_HELD"
    JOIN_THROTTLED = "JOIN_THROTTLED"
    GROUP_NOT_EMPTY = "GROUP_NOT_EMPTY"
    GROUP_HAS_CLIENTS = "GROUP_HAS_CLIENTS"
    OPERATION_IN_PROGRESS = "OPERATION_IN_PROGRESS"
    DESTINATION_NOT_ALLOWED = "DESTINATION_NOT_ALLOWED"
    TOO_MANY_TEMPLATES = "TOO_MANY_TEMPLATES"
    TOO_MANY_CLIENTS = "TOO_MANY_CLIENTS"
    TOO_MANY_WATCHERS = "TOO_MANY_WATCHERS"
    WATCHER_TOO_SLOW = "WATCHER_TOO_SLOW"
    TOO_MANY_RANGE_READS = "TOO_MANY_RANGE_READS"


@dataclasses.dataclass(frozen=True)
class ReasonSpec:
    code: grpc.StatusCode
    meaning: str


CATALOGUE: Mapping[Reason, ReasonSpec] = {
    Reason.INVALID_FIELD: ReasonSpec(
        grpc.StatusCode.INVALID_ARGUMENT,
        "A request field is missing, malformed or out of range; metadata `field` names it.",
    ),
    Reason.GROUP_NOT_FOUND: ReasonSpec(
        grpc.StatusCode.NOT_FOUND, "The group does not exist on the assigner."
    ),
    Reason.GROUP_ALREADY_EXISTS: ReasonSpec(
        grpc.StatusCode.ALREADY_EXISTS, "CreateGroup for a name that exists with other settings."
    ),
    Reason.TOPIC_NOT_FOUND: ReasonSpec(
        grpc.StatusCode.NOT_FOUND, "A topic named in the request does not exist in Kafka."
    ),
    Reason.SIDECAR_NOT_FOUND: ReasonSpec(
        grpc.StatusCode.NOT_FOUND, "The sidecar id is not a live member of the group."
    ),
    Reason.GROUP_NOT_SERVED: ReasonSpec(
        grpc.StatusCode.NOT_FOUND,
        "This sidecar does not serve the requested group (it serves metadata `served_group`).",
    ),
    Reason.NOT_LEADER: ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION,
        "This assigner is a follower; trailing metadata `ds-leader` names the leader.",
    ),
    Reason.SESSION_NOT_JOINED: ReasonSpec(
        grpc.StatusCode.INVALID_ARGUMENT, "The first message of a Session stream was not a join."
    ),
    Reason.LEASE_NOT_HELD: ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION,
        "This sidecar does not hold a live lease on the partition (moved or expired).",
    ),
    Reason.LEASE_EPOCH_STALE: ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION,
        "The ack or commit names a lease epoch older than the current one; it is refused.",
    ),
    Reason.OFFSET_OUT_OF_RANGE: ReasonSpec(
        grpc.StatusCode.OUT_OF_RANGE, "The requested offset range is outside the partition's log."
    ),
    Reason.GROUP_MODE_MISMATCH: ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION, "The operation does not apply to the group's mode."
    ),
    Reason.CONFIG_VERSION_CONFLICT: ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION,
        "UpdateGroup's expected_config_version is not the group's current version.",
    ),
    Reason.KAFKA_UNAVAILABLE: ReasonSpec(
        grpc.StatusCode.UNAVAILABLE, "Kafka cannot be reached right now; retry with backoff."
    ),
    Reason.SERVICE_NOT_READY: ReasonSpec(
        grpc.StatusCode.UNAVAILABLE, "The service is starting or stopping; retry with backoff."
    ),
    Reason.PERMISSION_DENIED: ReasonSpec(
        grpc.StatusCode.PERMISSION_DENIED,
        "The caller may not perform this operation; metadata `permission` names what it "
        "needs and `identity` who called.",
    ),
    Reason.UNAUTHENTICATED: ReasonSpec(
        grpc.StatusCode.UNAUTHENTICATED,
        "Authorization is on and the call carries no valid identity (no token, or a bad or "
        "expired one, or no client certificate); metadata `why` says which.",
    ),
    Reason.SESSION_HELD: ReasonSpec(
        grpc.StatusCode.PERMISSION_DENIED,
        "A live session of another identity holds this sidecar id; metadata `sidecar_id`.",
    ),
    Reason.JOIN_THROTTLED: ReasonSpec(
        grpc.StatusCode.UNAVAILABLE,
        "The assigner is taking on joins as fast as it can (a reconnect storm); its attached "
        "sidecars' heartbeats come first. Join again after metadata `retry_after_ms`, with "
        "jitter.",
    ),
    Reason.ALERT_TEMPLATE_NOT_FOUND: ReasonSpec(
        grpc.StatusCode.NOT_FOUND, "No alert template with this caller and name exists."
    ),
    Reason.GROUP_NOT_EMPTY: ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION,
        "The Kafka consumer group has members (metadata `members`); stop them first, as "
        "kafka-consumer-groups --reset-offsets requires.",
    ),
    Reason.GROUP_HAS_CLIENTS: ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION,
        "DeleteGroup: application clients are bound to the group (metadata `clients`, "
        "comma-separated, the first 20, and `client_count`); stop them, or delete with "
        "force.",
    ),
    Reason.OPERATION_IN_PROGRESS: ReasonSpec(
        grpc.StatusCode.FAILED_PRECONDITION,
        "Another operation on the group (metadata `operation`: an offset reset of the same "
        "partitions, a mode switch) is running; retry once it is done.",
    ),
    Reason.DESTINATION_NOT_ALLOWED: ReasonSpec(
        grpc.StatusCode.INVALID_ARGUMENT,
        "An alert route names a Kafka topic outside the alerts prefix, or a webhook whose "
        "host is not in the egress allow-list or resolves to a private, loopback or "
        "link-local address not allow-listed; metadata `field`.",
    ),
    Reason.TOO_MANY_TEMPLATES: ReasonSpec(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "The caller has as many alert templates as allowed (notifier setting "
        "`alerts.max_templates_per_caller`); metadata `caller`, `limit`.",
    ),
    Reason.TOO_MANY_CLIENTS: ReasonSpec(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "The group has as many bound clients as allowed (assigner setting "
        "`max_clients_per_group`); unbind one first. Metadata `group`, `limit`.",
    ),
    Reason.TOO_MANY_WATCHERS: ReasonSpec(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "The group has as many WatchBinding streams as allowed (assigner setting "
        "`max_watchers_per_group`); metadata `group`, `limit`. Or a server has as many "
        "Health.Watch streams open as it serves (256); metadata `service`, `limit`.",
    ),
    Reason.WATCHER_TOO_SLOW: ReasonSpec(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "A WatchBinding stream fell `watch_queue_max` bindings behind and was dropped; "
        "watch again (with the known version) to get the current binding.",
    ),
    Reason.TOO_MANY_RANGE_READS: ReasonSpec(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "The sidecar runs as many ReadRange streams as allowed (`limit` `streams`: sidecar "
        "setting `read_range_max_streams`), or the open ones hold the memory ReadRange may "
        "use (`limit` `bytes`: `read_range_buffer_share` of `buffer_max_bytes`); retry when "
        "one has ended. Metadata `limit`, `open_streams`, `max_streams`, `reserved_bytes`, "
        "`needed_bytes`, `budget_bytes`.",
    ),
}


class DsError(Exception):
    """An error with a catalogued reason; raised by servicers and domain code alike."""

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        metadata: Mapping[str, str] | None = None,
        trailing: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata or {})
        self.trailing = dict(trailing or {})

    @property
    def code(self) -> grpc.StatusCode:
        return CATALOGUE[self.reason].code

    def to_status(self) -> status_pb2.Status:
        info = error_details_pb2.ErrorInfo(
            reason=self.reason.value, domain=DOMAIN, metadata=self.metadata
        )
        detail = any_pb2.Any()
        detail.Pack(info)
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=[detail])


def invalid(field: str, message: str) -> DsError:
    """Shorthand for the most common error: a bad request field."""
    return DsError(Reason.INVALID_FIELD, f"{field}: {message}", metadata={"field": field})


def _trailing(error: grpc.RpcError) -> list[tuple[str, str | bytes]]:
    """Trailing metadata of a failed call, sync (grpc.Call) or asyncio (AioRpcError)."""
    getter = getattr(error, "trailing_metadata", None)
    if getter is None:
        return []
    return [(str(k), v) for k, v in (getter() or ())]


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo detail of a failed call, if the server sent one."""
    for key, value in _trailing(error):
        if key != _STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        for detail in status_pb2.Status.FromString(value).details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return info
    return None


RETRY_AFTER_METADATA_KEY = "retry_after_ms"


def retry_after(error: grpc.RpcError) -> float | None:
    """Seconds the server asked the caller to wait before trying again (ErrorInfo metadata
    ``retry_after_ms``), or None when it named none."""
    info = error_info(error)
    if info is None or RETRY_AFTER_METADATA_KEY not in info.metadata:
        return None
    try:
        return max(0.0, int(info.metadata[RETRY_AFTER_METADATA_KEY]) / 1000)
    except ValueError:
        return None


def trailing_value(error: grpc.RpcError, key: str) -> str | None:
    """A trailing-metadata value of a failed call (e.g. ``ds-leader``)."""
    for item_key, value in _trailing(error):
        if item_key == key:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None
