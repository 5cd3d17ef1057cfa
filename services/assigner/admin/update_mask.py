"""UpdateGroup's field mask (AIP-134) over ``GroupConfig`` (pure): which paths may change,
the config a mask leaves, and which paths a change really touched."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import field_mask_pb2

from dataservice.assigner.v1 import types_pb2
from dsclient.reasons import DsError, Reason

# update_mask paths of GroupConfig that UpdateGroup may change.
MUTABLE_PATHS = (
    "topics",
    "mode",
    "consumer_config",
    "alert_template",
    "lease_ttl",
    "heartbeat_interval",
    "balance_strategy",
    "visibility_timeout",
    "max_deliveries",
    "external_offset_changes",
    "dead_letter_topic",
    "ordering",
    "commit_fencing",
)
IMMUTABLE_PATHS = frozenset({"name", "config_version"})


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
        elif path == "visibility_timeout":
            result.ClearField("visibility_timeout")
            if patch.HasField("visibility_timeout"):
                result.visibility_timeout.CopyFrom(patch.visibility_timeout)
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
