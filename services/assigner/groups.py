"""Live state of the groups: the coordinator of each, its open Session streams, bindings.

This is the adapter between the pure :mod:`coordinator` and the gRPC streams: it turns
coordinator commands into ``SessionResponse`` messages on the right stream, and pushes a
new :class:`Binding` to every watching client whenever the holders of a group change.
Everything here runs on the asyncio loop; nothing blocks.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import assigner_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from services.assigner.balancer import TopicPartition
from services.assigner.coordinator import (
    Command,
    GrantCmd,
    GroupCoordinator,
    HeldLease,
    MemberInfo,
    Outcome,
    Progress,
    Released,
    RevokeCmd,
    RevokeWhy,
    Timing,
)
from services.assigner.metrics import AssignerMetrics
from services.assigner.settings import AssignerSettings, GroupSeed

log = structlog.get_logger(__name__)

_REVOKE_REASONS = {
    RevokeWhy.REBALANCE: assigner_pb2.REVOKE_REASON_REBALANCE,
    RevokeWhy.MOVE: assigner_pb2.REVOKE_REASON_MOVE,
    RevokeWhy.SHUTDOWN: assigner_pb2.REVOKE_REASON_SHUTDOWN,
}
_MODES = {
    "leased": common_pb2.GROUP_MODE_LEASED,
    "kafka_group": common_pb2.GROUP_MODE_KAFKA_GROUP,
}


def duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


@dataclass
class Connection:
    """One open Session stream of one sidecar."""

    member_id: str
    session_id: str
    queue: asyncio.Queue[assigner_pb2.SessionResponse | None] = field(default_factory=asyncio.Queue)

    def send(self, message: assigner_pb2.SessionResponse) -> None:
        self.queue.put_nowait(message)

    def close(self) -> None:
        self.queue.put_nowait(None)


class GroupRuntime:
    def __init__(
        self,
        seed: GroupSeed,
        partitions: Iterable[TopicPartition],
        settings: AssignerSettings,
        metrics: AssignerMetrics,
    ) -> None:
        self.seed = seed
        self.settings = settings
        self.metrics = metrics
        self.coordinator = GroupCoordinator(
            seed.name,
            partitions,
            Timing(ttl=settings.lease_ttl_seconds, grace=settings.lease_grace_seconds),
        )
        self.connections: dict[str, Connection] = {}
        self.clients: set[str] = set()
        self.watchers: set[asyncio.Queue[types_pb2.Binding]] = set()
        self.binding_version = 0
        self._holders_seen: dict[str, tuple[TopicPartition, ...]] = {}
        self.log = log.bind(group=seed.name)

    @property
    def name(self) -> str:
        return self.seed.name

    def config_proto(self) -> types_pb2.GroupConfig:
        return types_pb2.GroupConfig(
            name=self.seed.name,
            topics=list(self.seed.topics),
            mode=_MODES[self.seed.mode],
            consumer_config=dict(self.seed.consumer_config),
            lease_ttl=duration(self.settings.lease_ttl_seconds),
            heartbeat_interval=duration(self.settings.heartbeat_interval_seconds),
            balance_strategy=types_pb2.BALANCE_STRATEGY_COUNT,
        )

    # ---- sessions ---------------------------------------------------------------------

    def attach(self, join: assigner_pb2.SessionJoin, now: float) -> Connection:
        previous = self.connections.pop(join.sidecar_id, None)
        if previous is not None:
            previous.close()  # a re-attach replaces the old stream
        conn = Connection(join.sidecar_id, uuid.uuid4().hex)
        self.connections[join.sidecar_id] = conn
        conn.send(
            assigner_pb2.SessionResponse(
                accepted=assigner_pb2.SessionAccepted(
                    session_id=conn.session_id,
                    lease_ttl=duration(self.settings.lease_ttl_seconds),
                    heartbeat_interval=duration(self.settings.heartbeat_interval_seconds),
                    mode=_MODES[self.seed.mode],
                    consumer_config=dict(self.seed.consumer_config),
                )
            )
        )
        member = MemberInfo(
            id=join.sidecar_id,
            endpoint=join.endpoint,
            session_id=conn.session_id,
            zone=join.zone or None,
            capacity=join.capacity or None,
        )
        held = [HeldLease(TopicPartition(h.topic, h.partition), h.epoch) for h in join.held_leases]
        outcome = self.coordinator.join(member, held, now)
        self.log.info(
            "sidecar joined",
            sidecar=join.sidecar_id,
            endpoint=join.endpoint,
            held=len(held),
            kept=len(outcome.renewed),
        )
        self.apply(outcome)
        return conn

    def detach(self, conn: Connection) -> None:
        """The stream ended. Not a lost lease: the member lives until its TTL runs out."""
        if self.connections.get(conn.member_id) is conn:
            del self.connections[conn.member_id]

    def heartbeat(self, conn: Connection, hb: assigner_pb2.SessionHeartbeat, now: float) -> None:
        progress = [
            Progress(TopicPartition(p.topic, p.partition), p.epoch, p.committed_offset)
            for p in hb.leases
        ]
        released = [
            Released(TopicPartition(r.topic, r.partition), r.epoch, r.committed_offset)
            for r in hb.released_leases
        ]
        outcome = self.coordinator.heartbeat(conn.member_id, progress, released, now)
        self.metrics.heartbeats.inc()
        conn.send(
            assigner_pb2.SessionResponse(
                heartbeat_ack=assigner_pb2.HeartbeatAck(
                    seq=hb.seq,
                    renewed_leases=[
                        types_pb2.LeaseRef(
                            topic=h.tp.topic, partition=h.tp.partition, epoch=h.epoch
                        )
                        for h in outcome.renewed
                    ],
                )
            )
        )
        for r in released:
            self.metrics.releases.inc()
            self.log.debug(
                "lease released",
                topic=r.tp.topic,
                partition=r.tp.partition,
                epoch=r.epoch,
                committed=r.committed,
            )
        self.apply(outcome)

    def leave(self, member_id: str, now: float) -> None:
        self.log.info("sidecar leaving", sidecar=member_id)
        self.apply(self.coordinator.leave(member_id, now))

    def tick(self, now: float) -> None:
        outcome = self.coordinator.disconnect_expired(now)
        for member_id in outcome.lost:
            self.log.warning("sidecar lost: no heartbeat within TTL + grace", sidecar=member_id)
            conn = self.connections.pop(member_id, None)
            if conn is not None:
                conn.close()
        self.apply(outcome)

    def set_partitions(self, partitions: Iterable[TopicPartition], now: float) -> None:
        before = len(self.coordinator.leases)
        self.coordinator.set_partitions(partitions)
        if len(self.coordinator.leases) != before:
            self.log.info("partitions added", total=len(self.coordinator.leases))
            self.apply(self.coordinator.disconnect_expired(now))

    # ---- commands and bindings ----------------------------------------------------------

    def apply(self, outcome: Outcome) -> None:
        for cmd in outcome.commands:
            self._dispatch(cmd)
        self._publish_binding_if_changed()
        self._export_distribution()

    def _dispatch(self, cmd: Command) -> None:
        conn = self.connections.get(cmd.member)
        if isinstance(cmd, GrantCmd):
            self.metrics.grants.inc()
            message = assigner_pb2.SessionResponse(
                grant=assigner_pb2.LeaseGrant(
                    topic=cmd.tp.topic,
                    partition=cmd.tp.partition,
                    epoch=cmd.epoch,
                    start_offset=cmd.start_offset,
                )
            )
        elif isinstance(cmd, RevokeCmd):
            self.metrics.revokes.inc()
            message = assigner_pb2.SessionResponse(
                revoke=assigner_pb2.LeaseRevoke(
                    topic=cmd.tp.topic,
                    partition=cmd.tp.partition,
                    epoch=cmd.epoch,
                    reason=_REVOKE_REASONS[cmd.reason],
                    drain_timeout=duration(self.settings.drain_timeout_seconds),
                )
            )
        if conn is None:
            # No open stream: the command is re-derived when the sidecar re-attaches, or
            # the lease lapses at its expiry (coordinator rules); nothing is lost.
            self.log.info("command for a detached sidecar deferred", sidecar=cmd.member)
            return
        conn.send(message)

    def binding_for(self, client_id: str) -> types_pb2.Binding:
        endpoints = []
        for member in self.coordinator.live_members():
            endpoints.append(
                types_pb2.SidecarEndpoint(
                    sidecar_id=member.id,
                    address=member.endpoint,
                    zone=member.zone or "",
                    partitions=[
                        common_pb2.TopicPartition(
                            topic=lease.tp.topic, partition=lease.tp.partition
                        )
                        for lease in self.coordinator.held_by(member.id)
                    ],
                )
            )
        return types_pb2.Binding(
            client_id=client_id, group=self.name, version=self.binding_version, endpoints=endpoints
        )

    def _publish_binding_if_changed(self) -> None:
        holders = {
            m.id: tuple(lease.tp for lease in self.coordinator.held_by(m.id))
            for m in self.coordinator.live_members()
        }
        if holders == self._holders_seen:
            return
        self._holders_seen = holders
        self.binding_version += 1
        for queue in list(self.watchers):
            queue.put_nowait(self.binding_for(""))

    def _export_distribution(self) -> None:
        counts = {
            m.id: len(self.coordinator.held_by(m.id)) for m in self.coordinator.live_members()
        }
        self.metrics.set_distribution(self.name, counts)
