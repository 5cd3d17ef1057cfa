"""The assigner's fault emitters (ARCHITECTURE §5.4): CONSUMER_LOST, CONSUMER_LEFT,
PARTITIONS_REASSIGNED, CLIENT_REBOUND, OFFSETS_RESET, GROUP_DELETED (a DeleteGroup's audit
record) and CONFIG_REJECTED (what a sidecar's heartbeats say of the group's consumer
config) per group, ASSIGNER_FAILOVER per replica.

Each hook is one call at a decision point of the assigner and turns it into reports on the
shared :class:`~services.runtime.reporter.FaultReporter`; none of them raises.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from dataservice.common.v1 import common_pb2
from services.runtime.faults import OPEN, RESOLVED, FaultTypeValue, dedupe_key, short_type
from services.runtime.reporter import FaultReporter, never_raises


class GroupFaults:
    """The assigner's fault hooks for one group: one call at each decision point."""

    def __init__(self, reporter: FaultReporter | None, group: str) -> None:
        self.reporter = reporter or FaultReporter.disabled("assigner")
        self.group = group
        self._holders: dict[object, str] = {}  # partition -> the member it was granted to
        self._reassigning = False
        self._serving: set[str] | None = None
        self._rejections: dict[str, tuple[int, str]] = {}  # member -> the refusal reported

    def _member(self, fault: FaultTypeValue, member_id: str, active: bool, message: str) -> None:
        self.reporter.track(
            (short_type(fault), member_id),
            active,
            fault,
            group=self.group,
            consumer_id=member_id,
            message=message,
            dedupe_key=dedupe_key(fault, self.group, member_id),
        )

    @never_raises
    def lost(self, member_id: str) -> None:
        """No heartbeat within TTL + grace (the lease expired without a Leave)."""
        self._member(
            common_pb2.FAULT_TYPE_CONSUMER_LOST,
            member_id,
            True,
            f"sidecar {member_id} lost: no heartbeat within lease TTL + grace",
        )

    @never_raises
    def disconnected(self, member_id: str) -> None:
        """Its Session stream ended without a Leave and it did not attach again within the
        reconnect window (a killed sidecar): lost, found by its socket, not its TTL."""
        self._member(
            common_pb2.FAULT_TYPE_CONSUMER_LOST,
            member_id,
            True,
            f"sidecar {member_id} lost: its session ended without a leave and it did not "
            "attach again within the reconnect window",
        )

    @never_raises
    def left(self, member_id: str, graceful: bool = True) -> None:
        how = "handed its partitions off" if graceful else "left without handing off"
        self._member(
            common_pb2.FAULT_TYPE_CONSUMER_LEFT,
            member_id,
            True,
            f"sidecar {member_id} left the group ({how})",
        )

    @never_raises
    def joined(self, member_id: str) -> None:
        """The sidecar is back: whatever was open about it is resolved."""
        for fault in (common_pb2.FAULT_TYPE_CONSUMER_LOST, common_pb2.FAULT_TYPE_CONSUMER_LEFT):
            self._member(fault, member_id, False, f"sidecar {member_id} joined the group")

    @never_raises
    def config_status(
        self, member_id: str, applied_version: int, rejection: tuple[int, str] | None
    ) -> None:
        """A heartbeat's report of the group's consumer config: a refusal (version, reason)
        not reported yet opens CONFIG_REJECTED for the member (again for a newer refusal);
        none any more resolves it (the member applied a later version cleanly)."""
        before = self._rejections.get(member_id)
        if rejection == before:
            return
        key = ("CONFIG_REJECTED", self.group, member_id)
        fault = common_pb2.FAULT_TYPE_CONFIG_REJECTED
        if rejection is None:
            del self._rejections[member_id]
            self.reporter.track(
                key, False, fault, message=f"sidecar {member_id} runs config {applied_version}"
            )
            return
        self._rejections[member_id] = rejection
        version, reason = rejection
        self.reporter.track(
            key,
            True,
            fault,
            repeat=True,
            group=self.group,
            consumer_id=member_id,
            message=f"sidecar {member_id} did not apply consumer config {version}: {reason}; "
            f"it runs config {applied_version}",
            attributes={
                "config_version": str(version),
                "reason": reason,
                "running_version": str(applied_version),
            },
            dedupe_key=dedupe_key(fault, self.group, member_id),
        )

    @never_raises
    def gone(self, member_id: str) -> None:
        """The member left or was lost: a refusal of its is moot (resolved)."""
        if member_id in self._rejections:
            del self._rejections[member_id]
            self.reporter.track(
                ("CONFIG_REJECTED", self.group, member_id),
                False,
                common_pb2.FAULT_TYPE_CONFIG_REJECTED,
                message=f"sidecar {member_id} left the group",
            )

    @never_raises
    def granted(self, grants: Iterable[tuple[object, str]], leases: Iterable[object]) -> None:
        """Grants just sent (partition, member): a partition granted to another member than
        before moved. RESOLVED once every partition of the group is held again."""
        moved: dict[str, list[int]] = {}
        sources: set[str] = set()
        targets: set[str] = set()
        for tp, member in grants:
            before = self._holders.get(tp)
            self._holders[tp] = member
            if before is not None and before != member:
                moved.setdefault(str(getattr(tp, "topic", "")), []).append(
                    int(getattr(tp, "partition", -1))
                )
                sources.add(before)
                targets.add(member)
        key = dedupe_key(common_pb2.FAULT_TYPE_PARTITIONS_REASSIGNED, self.group)
        if moved:
            self._reassigning = True
            for topic, partitions in sorted(moved.items()):
                self.reporter.report(
                    common_pb2.FAULT_TYPE_PARTITIONS_REASSIGNED,
                    OPEN,
                    group=self.group,
                    topic=topic,
                    partitions=partitions,
                    message=f"{len(partitions)} partition(s) of {topic} moved from "
                    f"{', '.join(sorted(sources))} to {', '.join(sorted(targets))}",
                    attributes={"from": ",".join(sorted(sources)), "to": ",".join(sorted(targets))},
                    dedupe_key=key,
                )
        if self._reassigning and all(
            getattr(getattr(lease, "state", None), "name", "") == "GRANTED" for lease in leases
        ):
            self._reassigning = False
            self.reporter.report(
                common_pb2.FAULT_TYPE_PARTITIONS_REASSIGNED,
                RESOLVED,
                group=self.group,
                message="every partition of the group is held again",
                dedupe_key=key,
            )

    @never_raises
    def rebound(self, serving: Iterable[str], clients: int) -> None:
        """The sidecars bound to the group's clients changed (the binding was pushed)."""
        now = set(serving)
        before, self._serving = self._serving, now
        if before is None or before == now or clients == 0:
            return
        key = dedupe_key(common_pb2.FAULT_TYPE_CLIENT_REBOUND, self.group)
        detail = {
            "clients": clients,
            "added": ",".join(sorted(now - before)),
            "removed": ",".join(sorted(before - now)),
        }
        message = f"{clients} client(s) rebound to {', '.join(sorted(now)) or 'no sidecar'}"
        for state in (OPEN, RESOLVED):
            self.reporter.report(
                common_pb2.FAULT_TYPE_CLIENT_REBOUND,
                state,
                group=self.group,
                message=message,
                attributes=detail,
                dedupe_key=key,
            )

    @never_raises
    def deleted(self, audit: DeleteAudit) -> None:
        """GROUP_DELETED: the audit record of a DeleteGroup (OPEN, then RESOLVED at once:
        the group is gone when reported)."""
        attributes = {
            "actor": audit.actor,
            "forced": "true" if audit.forced else "false",
            "clients": ",".join(audit.clients),
            "config_version": str(audit.config_version),
        }
        if audit.request_id:
            attributes["request_id"] = audit.request_id
        how = f", {len(audit.clients)} bound client(s) dropped" if audit.clients else ""
        message = f"group {self.group} deleted by {audit.actor or '?'}{how}"
        key = dedupe_key(common_pb2.FAULT_TYPE_GROUP_DELETED, self.group, audit.delete_id)
        for state in (OPEN, RESOLVED):
            self.reporter.report(
                common_pb2.FAULT_TYPE_GROUP_DELETED,
                state,
                group=self.group,
                message=message,
                attributes=attributes,
                dedupe_key=key,
            )

    @never_raises
    def offsets_reset(self, audit: ResetAudit) -> None:
        """OFFSETS_RESET: the audit record of a reset that committed new offsets, one event
        per topic (OPEN, then RESOLVED at once: the reset is complete when reported)."""
        by_topic: dict[str, list[tuple[int, int, int, int]]] = {}
        for topic, partition, old, new, epoch in audit.partitions:
            by_topic.setdefault(topic, []).append((partition, old, new, epoch))
        for topic, rows in sorted(by_topic.items()):
            rows.sort()
            offsets = ",".join(f"{p}:{old}->{new}" for p, old, new, _ in rows)
            attributes = {
                "actor": audit.actor,
                "source": audit.source,
                "strategy": audit.strategy,
                "offsets": offsets,
            }
            if any(epoch for *_, epoch in rows):
                attributes["epochs"] = ",".join(f"{p}:{epoch}" for p, _, _, epoch in rows)
            if audit.request_id:
                attributes["request_id"] = audit.request_id
            if audit.detected_by:
                attributes["detected_by"] = audit.detected_by
            if audit.action:
                attributes["action"] = audit.action
            # Unique per reset: an audit record is never merged with another one.
            key = dedupe_key(common_pb2.FAULT_TYPE_OFFSETS_RESET, self.group, topic, audit.reset_id)
            message = (
                f"offsets of {len(rows)} partition(s) of {topic} reset ({audit.strategy}) by "
                f"{audit.actor or '?'} ({audit.source})"
            )
            if audit.action == "reverted":
                message = (
                    f"external offset change of {len(rows)} partition(s) of {topic} by "
                    f"{audit.actor or '?'} reverted to the mesh's positions (the group's "
                    "external_offset_changes is revert)"
                )
            for state in (OPEN, RESOLVED):
                self.reporter.report(
                    common_pb2.FAULT_TYPE_OFFSETS_RESET,
                    state,
                    group=self.group,
                    topic=topic,
                    partitions=[p for p, *_ in rows],
                    message=message,
                    attributes=attributes,
                    dedupe_key=key,
                )


@dataclass(frozen=True)
class ResetAudit:
    """What OFFSETS_RESET records of one reset."""

    reset_id: str
    actor: str  # who asked: the caller's identity, else its address
    source: str  # "admin" (ResetOffsets) or "external" (a reset made with Kafka's tools)
    strategy: str
    request_id: str
    # (topic, partition, old offset, new offset, lease epoch; 0 = none), per partition.
    partitions: tuple[tuple[str, int, int, int, int], ...]
    detected_by: str = ""  # source "external": the sidecars that noticed the commit
    # "followed" (the default: the new offsets are the group's now) or "reverted" (revert
    # mode: an external change undone, old = its offset, new = the mesh's position again).
    action: str = ""


@never_raises
def report_failover(reporter: FaultReporter, leader: str | None, settle_seconds: float) -> None:
    """ASSIGNER_FAILOVER: this replica took over; RESOLVED once its settle period (TTL
    + grace, when re-attaching sidecars have adopted their leases) is over."""
    key = dedupe_key(common_pb2.FAULT_TYPE_ASSIGNER_FAILOVER)
    reporter.report(
        common_pb2.FAULT_TYPE_ASSIGNER_FAILOVER,
        OPEN,
        message=f"assigner {leader or '?'} took over leadership",
        attributes={"leader": leader or ""},
        dedupe_key=key,
    )
    timer = threading.Timer(
        max(settle_seconds, 0.0),
        reporter.report,
        args=(common_pb2.FAULT_TYPE_ASSIGNER_FAILOVER, RESOLVED),
        kwargs={"message": f"assigner {leader or '?'} settled", "dedupe_key": key},
    )
    timer.daemon = True
    timer.start()


@dataclass(frozen=True)
class DeleteAudit:
    """What GROUP_DELETED records of one DeleteGroup."""

    delete_id: str  # unique per deletion: its record is never merged with another one
    actor: str  # who asked: the caller's identity, else its address
    forced: bool
    clients: tuple[str, ...]  # the clients that were bound, sorted
    config_version: int
    request_id: str = ""
