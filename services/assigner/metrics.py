"""Every metric the assigner exports, declared against one injected registry.

Names follow the shared contract (docs/reference/metrics.md). prometheus_client appends
``_total`` to counters: ``Counter("ds_assigner_lease_grants", ...)`` is exported as
``ds_assigner_lease_grants_total``.

Handoff latency is measured from the moment the assigner sends ``Revoke`` for a partition
to the first heartbeat of the next holder that renews the partition under its new epoch
(the new owner has it and is serving it). A handoff back to the same sidecar (static
identity after a graceful restart) counts too; a lease that simply lapses (lost sidecar,
no revoke) does not: its cost is the lease expiry, counted in
``ds_assigner_lease_expiries_total``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Handoffs wait for the holder to drain (drain timeout, default 5 s) and, after a graceful
# leave under hold_mode reserve, for the hold window (default 10 s): buckets reach well past
# both.
HANDOFF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0)


def imbalance_ratio(counts: Mapping[str, int]) -> float:
    """max / mean partitions per sidecar (1.0 = perfectly even); 0.0 when there is no
    sidecar or no partition is held (nothing to compare)."""
    if not counts:
        return 0.0
    total = sum(counts.values())
    if total <= 0:
        return 0.0
    return max(counts.values()) / (total / len(counts))


class AssignerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.heartbeats = Counter(
            "ds_assigner_heartbeats", "Session heartbeats received", registry=registry
        )
        self.grants = Counter(
            "ds_assigner_lease_grants", "Lease grants sent", ["group"], registry=registry
        )
        self.revokes = Counter(
            "ds_assigner_lease_revokes", "Lease revokes sent", ["group"], registry=registry
        )
        self.expiries = Counter(
            "ds_assigner_lease_expiries",
            "Leases that lapsed at their expiry without being released (holder lost, "
            "or a revoke not answered in time)",
            ["group"],
            registry=registry,
        )
        self.grants_withheld = Counter(
            "ds_assigner_grants_withheld",
            "Grants decided but never sent: their epoch could not be written in time "
            "(write_failed), or their lease lapsed or moved on while it was (superseded)",
            ["group", "reason"],
            registry=registry,
        )
        self.releases = Counter(
            "ds_assigner_lease_releases", "Leases released by their holder", registry=registry
        )
        self.watchers_dropped = Counter(
            "ds_assigner_binding_watchers_dropped",
            "WatchBinding streams dropped for falling watch_queue_max bindings behind",
            ["group"],
            registry=registry,
        )
        self.state_bad_records = Counter(
            "ds_assigner_state_bad_records",
            "Records of the state topic that did not parse, skipped while loading it, by "
            "their key's kind (group, epoch, binding, unknown)",
            ["kind"],
            registry=registry,
        )
        self.handoff_latency = Histogram(
            "ds_assigner_handoff_latency_seconds",
            "Revoke sent -> first heartbeat of the next holder renewing the partition "
            "under its new epoch",
            ["group"],
            buckets=HANDOFF_BUCKETS,
            registry=registry,
        )
        self.sessions = Gauge(
            "ds_assigner_sessions", "Open sidecar Session streams", registry=registry
        )
        self.joins_throttled = Counter(
            "ds_assigner_joins_throttled",
            "Session joins refused with a retry-after (JOIN_THROTTLED): more joins than the "
            "admission policy takes on (join_rate, join_burst)",
            registry=registry,
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
        self.sidecar_rate = Gauge(
            "ds_assigner_sidecar_bytes_per_second",
            "Bytes/s the sidecar fetches for the group, summed over its leases (as reported "
            "in its last heartbeat)",
            ["group", "sidecar"],
            registry=registry,
        )
        self.imbalance = Gauge(
            "ds_assigner_imbalance_ratio",
            "max / mean partitions per serving sidecar (1 = even; 0 = no sidecar)",
            ["group"],
            registry=registry,
        )
        self.bindings = Gauge(
            "ds_assigner_bindings", "Application clients bound to the group", ["group"],
            registry=registry,
        )  # fmt: skip
        self.rebinds = Counter(
            "ds_assigner_rebinds",
            "Client rebinds: bound clients pushed a binding whose set of sidecars changed "
            "(one per client per change)",
            ["group"],
            registry=registry,
        )
        self.leader = Gauge(
            "ds_assigner_leader", "1 while this assigner instance leads, else 0",
            registry=registry,
        )  # fmt: skip
        self.leader.set(0)
        # group -> sidecar -> its labelled partition-count gauge and the count it shows:
        # the distribution is set on every join, leave and move, and at 1,000 sidecars a
        # labels() lookup per sidecar each time was most of a join's cost.
        self._known: dict[str, dict[str, tuple[Gauge, int]]] = {}
        # group -> sidecar -> its labelled rate gauge: looked up per heartbeat, and
        # ``labels()`` (label checks, a lock, a dict of tuples) is the dear part of a set.
        self._rated: dict[str, dict[str, Gauge]] = {}

    def set_distribution(self, group: str, counts: Mapping[str, int]) -> None:
        known = self._known.setdefault(group, {})
        for gone in set(known) - set(counts):
            self.partitions.remove(group, gone)
            del known[gone]
        rated = self._rated.get(group, {})
        for gone in set(rated) - set(counts):
            self.sidecar_rate.remove(group, gone)
            del rated[gone]
        for sidecar, count in counts.items():
            entry = known.get(sidecar)
            if entry is None:
                gauge = self.partitions.labels(group, sidecar)
            elif entry[1] != count:
                gauge = entry[0]
            else:
                continue  # unchanged
            gauge.set(count)
            known[sidecar] = (gauge, count)
        # The group's counters exist from 0 on, so the first expiry or rebind is an
        # increase() that alert rules see (a series born at 1 shows no increase).
        for counter in (self.grants, self.revokes, self.expiries, self.rebinds):
            counter.labels(group)
        self.members.labels(group).set(len(counts))
        self.imbalance.labels(group).set(imbalance_ratio(counts))

    def set_sidecar_rate(self, group: str, sidecar: str, bytes_per_second: float) -> None:
        rated = self._rated.setdefault(group, {})
        gauge = rated.get(sidecar)
        if gauge is None:
            gauge = rated[sidecar] = self.sidecar_rate.labels(group, sidecar)
        gauge.set(bytes_per_second)

    def forget_group(self, group: str) -> None:
        """The group is no longer served here (leadership lost): drop its series so a
        follower does not export a stale distribution."""
        for sidecar in self._known.pop(group, {}):
            self.partitions.remove(group, sidecar)
        for sidecar in self._rated.pop(group, {}):
            self.sidecar_rate.remove(group, sidecar)
        for gauge in (self.members, self.imbalance, self.bindings):
            with contextlib.suppress(KeyError):
                gauge.remove(group)
