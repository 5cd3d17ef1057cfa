"""A validated ``GroupConfig`` as the durable :class:`~services.assigner.state.GroupRecord`
(pure): what the record carries is copied, what it cannot carry yet must be the default."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dataservice.assigner.v1 import types_pb2
from dsclient.reasons import invalid
from services.assigner.admin.validation import seconds
from services.assigner.group_timing import GroupTiming, effective_timing, record_timing
from services.assigner.state import GroupRecord
from services.runtime.group_enums import (
    BALANCE_STRATEGIES,
    COMMIT_FENCINGS,
    EXTERNAL_OFFSET_CHANGES,
    MODES,
    ORDERINGS,
)

# GroupRecord field -> the GroupConfig field it comes from (for error messages).
SEED_FIELD_PATHS: Mapping[str, str] = {
    "alert_template": "alert_template",
    "balance_strategy": "balance_strategy",
}


def record_fields(cfg: types_pb2.GroupConfig, default: GroupTiming) -> dict[str, Any]:
    """A validated GroupConfig as GroupRecord fields (None = server default; a lease TTL or
    heartbeat interval equal to the assigner's ``default`` is stored as None)."""
    ttl, heartbeat = record_timing(
        effective_timing(
            seconds(cfg.lease_ttl) if cfg.HasField("lease_ttl") else None,
            seconds(cfg.heartbeat_interval) if cfg.HasField("heartbeat_interval") else None,
            default,
        ),
        default,
    )
    return {
        "name": cfg.name,
        "topics": list(cfg.topics),
        "mode": MODES[cfg.mode],
        "consumer_config": dict(cfg.consumer_config),
        "alert_template": cfg.alert_template,
        "lease_ttl_seconds": ttl,
        "heartbeat_interval_seconds": heartbeat,
        "balance_strategy": BALANCE_STRATEGIES[cfg.balance_strategy],
        "visibility_timeout_seconds": (
            seconds(cfg.visibility_timeout) if cfg.HasField("visibility_timeout") else None
        ),
        "max_deliveries": cfg.max_deliveries,
        "external_offset_changes": EXTERNAL_OFFSET_CHANGES[cfg.external_offset_changes],
        "dead_letter_topic": cfg.dead_letter_topic,
        "ordering": ORDERINGS[cfg.ordering],
        "commit_fencing": COMMIT_FENCINGS[cfg.commit_fencing],
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
