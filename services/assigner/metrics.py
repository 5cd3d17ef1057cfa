"""Every metric the assigner exports, declared against one injected registry."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge


class AssignerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.heartbeats = Counter(
            "ds_assigner_heartbeats", "Session heartbeats received", registry=registry
        )
        self.grants = Counter("ds_assigner_lease_grants", "Lease grants sent", registry=registry)
        self.revokes = Counter("ds_assigner_lease_revokes", "Lease revokes sent", registry=registry)
        self.releases = Counter(
            "ds_assigner_lease_releases", "Leases released by their holder", registry=registry
        )
        self.sessions = Gauge(
            "ds_assigner_sessions", "Open sidecar Session streams", registry=registry
        )
        self.partitions = Gauge(
            "ds_assigner_partitions",
            "Partitions leased per sidecar",
            ["group", "sidecar"],
            registry=registry,
        )
        self.members = Gauge(
            "ds_assigner_members", "Live sidecars per group", ["group"], registry=registry
        )
        self._known: dict[str, set[str]] = {}

    def set_distribution(self, group: str, counts: Mapping[str, int]) -> None:
        for gone in self._known.get(group, set()) - set(counts):
            self.partitions.remove(group, gone)
        for sidecar, count in counts.items():
            self.partitions.labels(group, sidecar).set(count)
        self._known[group] = set(counts)
        self.members.labels(group).set(len(counts))
