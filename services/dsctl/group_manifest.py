"""DsGroup documents (deploy/k8s/base/crds/dsgroup.yaml) and the assigner's GroupConfig,
both ways, and the plan that takes a live group to a declared one (pure: no I/O).

The same YAML a cluster reconciles is what ``dsctl apply -f`` / ``dsctl diff -f`` read
outside Kubernetes, so git holds the truth either way. A document manages the fields it
names, like ``kubectl apply``: ``topics`` and ``mode`` always (``mode`` defaults to
``leased``, as the CRD's schema defaults it), every other field only when the document
sets it. A field it leaves out keeps the group's value, which for a new group is the
assigner's default (a lease TTL of 3 s and so on): the assigner fills its defaults in, and a
document that had to spell them out to compare equal would not survive a changed default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import duration_pb2

from dataservice.assigner.v1 import admin_pb2, types_pb2
from services.runtime.group_enums import (
    BALANCE_STRATEGY_BY_NAME,
    COMMIT_FENCING_BY_NAME,
    EXTERNAL_CHANGE_BY_NAME,
    MODE_BY_NAME,
    ORDERING_BY_NAME,
)

API_VERSION = "dataservice.io/v1alpha1"
KIND = "DsGroup"

DURATIONS = {
    "visibilityTimeout": "visibility_timeout",
    "leaseTtl": "lease_ttl",
    "heartbeatInterval": "heartbeat_interval",
}
# spec key -> UpdateGroup update_mask path. Every mutable GroupConfig field has one.
PATHS = {
    "topics": "topics",
    "mode": "mode",
    "consumerConfig": "consumer_config",
    "alertTemplateRef": "alert_template",
    **DURATIONS,
    "maxDeliveries": "max_deliveries",
    "balanceStrategy": "balance_strategy",
    "externalOffsetChanges": "external_offset_changes",
    "ordering": "ordering",
    "commitFencing": "commit_fencing",
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class ManifestError(ValueError):
    """A document that is not a valid DsGroup; the message names the document and field."""


def parse_duration(text: str, where: str) -> duration_pb2.Duration:
    """A Go-style duration (``45s``, ``1m30s``, ``500ms``) as a protobuf Duration."""
    matches = list(_DURATION.finditer(text))
    if not matches or "".join(m.group(0) for m in matches) != text:
        raise ManifestError(f"{where}: {text!r} is not a duration like 45s, 2m or 500ms")
    nanos = round(sum(float(m.group(1)) * _UNIT_SECONDS[m.group(2)] for m in matches) * 1e9)
    out = duration_pb2.Duration()
    out.FromNanoseconds(nanos)
    return out


def format_duration(value: duration_pb2.Duration) -> str:
    """The shortest exact Go-style spelling: ``45s``, ``2m``, ``1m30s``, ``1500ms``."""
    nanos = value.ToNanoseconds()
    if nanos % 1_000_000_000:
        return f"{nanos // 1_000_000}ms"
    seconds = nanos // 1_000_000_000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"


def _choice(value: Any, choices: Mapping[str, int], where: str) -> int:
    if value not in choices:
        raise ManifestError(f"{where}: {value!r} is not one of {', '.join(choices)}")
    return choices[value]


def group_name(doc: Mapping[str, Any]) -> str:
    """spec.groupName, else metadata.name."""
    spec = doc.get("spec") or {}
    name = spec.get("groupName") or (doc.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{KIND} without metadata.name")
    return name


def config_of(doc: Mapping[str, Any]) -> types_pb2.GroupConfig:
    """The GroupConfig a DsGroup document declares (config_version 0)."""
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise ManifestError(
            f"{doc.get('kind')!r} {doc.get('apiVersion')!r}: only {KIND} {API_VERSION}"
        )
    name = group_name(doc)
    where = f"{KIND} {name}"
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise ManifestError(f"{where}: no spec")
    unknown = set(spec) - set(PATHS) - {"groupName"}
    if unknown:
        raise ManifestError(f"{where}: unknown spec field(s) {', '.join(sorted(unknown))}")
    topics = spec.get("topics")
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) for t in topics):
        raise ManifestError(f"{where}: spec.topics must be a non-empty list of topic names")
    config = types_pb2.GroupConfig(
        name=name,
        topics=topics,
        mode=_choice(spec.get("mode", "leased"), MODE_BY_NAME, f"{where}: spec.mode"),  # type: ignore[arg-type]
    )
    consumer = spec.get("consumerConfig") or {}
    if not isinstance(consumer, Mapping):
        raise ManifestError(f"{where}: spec.consumerConfig must be a map of strings")
    config.consumer_config.update({str(k): str(v) for k, v in consumer.items()})
    if (ref := spec.get("alertTemplateRef")) is not None:
        if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
            raise ManifestError(f"{where}: spec.alertTemplateRef needs a name")
        config.alert_template = ref["name"]
    for key, field in DURATIONS.items():
        if (text := spec.get(key)) is not None:
            getattr(config, field).CopyFrom(parse_duration(str(text), f"{where}: spec.{key}"))
    if (deliveries := spec.get("maxDeliveries")) is not None:
        if not isinstance(deliveries, int) or deliveries < -1:
            raise ManifestError(f"{where}: spec.maxDeliveries must be an integer >= -1")
        config.max_deliveries = deliveries
    if (strategy := spec.get("balanceStrategy")) is not None:
        config.balance_strategy = _choice(  # type: ignore[assignment]
            strategy, BALANCE_STRATEGY_BY_NAME, f"{where}: spec.balanceStrategy"
        )
    if (changes := spec.get("externalOffsetChanges")) is not None:
        config.external_offset_changes = _choice(  # type: ignore[assignment]
            changes, EXTERNAL_CHANGE_BY_NAME, f"{where}: spec.externalOffsetChanges"
        )
    if (ordering := spec.get("ordering")) is not None:
        config.ordering = _choice(ordering, ORDERING_BY_NAME, f"{where}: spec.ordering")  # type: ignore[assignment]
    if (fencing := spec.get("commitFencing")) is not None:
        config.commit_fencing = _choice(  # type: ignore[assignment]
            fencing, COMMIT_FENCING_BY_NAME, f"{where}: spec.commitFencing"
        )
    return config


def _name_of(choices: Mapping[str, int], value: int) -> str | None:
    return next((name for name, number in choices.items() if number == value), None)


def spec_of(config: types_pb2.GroupConfig) -> dict[str, Any]:
    """A DsGroup spec for ``config``, unset fields left out (so it compares with a
    document's spec whatever the document spells as a default)."""
    spec: dict[str, Any] = {"topics": list(config.topics)}
    spec["mode"] = _name_of(MODE_BY_NAME, config.mode) or "leased"
    if config.consumer_config:
        spec["consumerConfig"] = dict(sorted(config.consumer_config.items()))
    if config.alert_template:
        spec["alertTemplateRef"] = {"name": config.alert_template}
    for key, field in DURATIONS.items():
        if config.HasField(field):  # type: ignore[arg-type]
            spec[key] = format_duration(getattr(config, field))
    if config.max_deliveries:
        spec["maxDeliveries"] = config.max_deliveries
    if strategy := _name_of(BALANCE_STRATEGY_BY_NAME, config.balance_strategy):
        spec["balanceStrategy"] = strategy
    if changes := _name_of(EXTERNAL_CHANGE_BY_NAME, config.external_offset_changes):
        spec["externalOffsetChanges"] = changes
    if ordering := _name_of(ORDERING_BY_NAME, config.ordering):
        spec["ordering"] = ordering
    if fencing := _name_of(COMMIT_FENCING_BY_NAME, config.commit_fencing):
        spec["commitFencing"] = fencing
    return spec


def document_of(
    described: admin_pb2.DescribeGroupResponse, namespace: str | None = None
) -> dict[str, Any]:
    """A DsGroup document for a live group, with its status from the mesh (what ``dsctl get
    group X -o yaml`` prints and the operator writes as status)."""
    config = described.config
    metadata: dict[str, Any] = {"name": config.name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": spec_of(config),
        "status": status_of(described),
    }


def status_of(described: admin_pb2.DescribeGroupResponse) -> dict[str, Any]:
    """members, partitions, partitions held, lag and config version from DescribeGroup."""
    held = sum(1 for lease in described.leases if lease.holder)
    return {
        "groupName": described.config.name,
        "configVersion": described.config.config_version,
        "members": len(described.members),
        "partitions": len(described.partitions) or len(described.leases),
        "partitionsHeld": held,
        "lagRecords": sum(max(p.lag_records, 0) for p in described.partitions),
    }


@dataclass(frozen=True)
class Change:
    """What applying one document does: create the group, update ``paths``, or nothing."""

    group: str
    action: str  # "create" | "update" | "unchanged"
    desired: types_pb2.GroupConfig
    keys: tuple[str, ...]  # the spec keys the document manages
    paths: tuple[str, ...] = ()  # UpdateGroup's update_mask: the managed fields that differ


ALWAYS_MANAGED = ("topics", "mode")


def managed_keys(doc: Mapping[str, Any]) -> list[str]:
    """The spec keys a document manages: topics, mode and whatever else it sets."""
    spec = doc.get("spec") or {}
    return [key for key in PATHS if key in ALWAYS_MANAGED or key in spec]


def managed_spec(config: types_pb2.GroupConfig, keys: Iterable[str]) -> dict[str, Any]:
    """``spec_of(config)`` cut to ``keys`` (a key the config leaves unset stays absent)."""
    spec = spec_of(config)
    return {key: spec[key] for key in keys if key in spec}


def changed_spec_keys(
    current: types_pb2.GroupConfig, desired: types_pb2.GroupConfig, keys: Iterable[str]
) -> list[str]:
    """The managed keys whose values differ (a key unset on one side differs from a set one)."""
    live, declared = managed_spec(current, keys), managed_spec(desired, keys)
    return [key for key in keys if live.get(key) != declared.get(key)]


def plan(
    docs: Iterable[Mapping[str, Any]], live: Mapping[str, types_pb2.GroupConfig]
) -> list[Change]:
    """One Change per document, in file order; ``live`` maps group names to their config."""
    changes: list[Change] = []
    seen: set[str] = set()
    for doc in docs:
        desired = config_of(doc)
        if desired.name in seen:
            raise ManifestError(f"{KIND} {desired.name} is declared twice")
        seen.add(desired.name)
        keys = tuple(managed_keys(doc))
        current = live.get(desired.name)
        if current is None:
            changes.append(Change(desired.name, "create", desired, keys))
            continue
        paths = tuple(PATHS[k] for k in changed_spec_keys(current, desired, keys))
        action = "update" if paths else "unchanged"
        changes.append(Change(desired.name, action, desired, keys, paths))
    return changes
