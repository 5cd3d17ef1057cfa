"""Live state of the groups: the coordinator of each, its open Session streams, bindings.

This is the adapter between the pure :mod:`coordinator` and the gRPC streams: it turns
coordinator commands into ``SessionResponse`` messages on the right stream — a grant only
after its epoch is durable in the state topic (a bounded write: one that fails or times
out takes the grant back, one that outlasts the lease is not sent), and never overtaken by
a later message on the same stream — and tells the group's bindings
(:mod:`services.assigner.bindings`: bound clients, their liveness, the WatchBinding
streams) whenever the holders of a group change. Everything here runs on the asyncio loop;
nothing blocks.

One job, why whole (about 780 lines): one group's live state between the coordinator and the
Session streams. The grant dispatch (an epoch durable before its grant is sent, never
overtaken on its stream, taken back when the write fails) shares the connections, the
coordinator and the state writes with the heartbeat handling that feeds it; the bindings,
the one part with state of its own, are in bindings.py.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import structlog
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import assigner_pb2, types_pb2
from dsclient.reasons import DsError, Reason
from services.assigner.balancer import Strategy
from services.assigner.bindings import GroupBindings
from services.assigner.client_activity import ClientActivity, ClientRow, Totals, client_rows
from services.assigner.coordinator import (
    Command,
    GrantCmd,
    GroupCoordinator,
    HeldLease,
    HoldMode,
    MemberInfo,
    Outcome,
    Progress,
    Released,
    RevokeCmd,
    RevokeWhy,
    Timing,
)
from services.assigner.fault_emitters import GroupFaults
from services.assigner.group_timing import (
    GroupTiming,
    TimingStep,
    effective_timing,
    rollout_ttl,
    start_rollout,
)
from services.assigner.metrics import AssignerMetrics
from services.assigner.settings import AssignerSettings, GroupSeed
from services.assigner.state import GroupRecord
from services.runtime.group_enums import (
    BALANCE_STRATEGY_BY_NAME,
    COMMIT_FENCING_BY_NAME,
    EXTERNAL_CHANGE_BY_NAME,
    MODE_BY_NAME,
    ORDERING_BY_NAME,
)
from services.runtime.reporter import FaultReporter
from services.runtime.topic_partition import TopicPartition

log = structlog.get_logger(__name__)
T = TypeVar("T")

_REVOKE_REASONS = {
    RevokeWhy.REBALANCE: assigner_pb2.REVOKE_REASON_REBALANCE,
    RevokeWhy.MOVE: assigner_pb2.REVOKE_REASON_MOVE,
    RevokeWhy.SHUTDOWN: assigner_pb2.REVOKE_REASON_SHUTDOWN,
    RevokeWhy.FENCED: assigner_pb2.REVOKE_REASON_FENCED,
    RevokeWhy.RESET: assigner_pb2.REVOKE_REASON_CONFIG,
    RevokeWhy.CONFIG: assigner_pb2.REVOKE_REASON_CONFIG,
}
# A record's commit fencing "" is unspecified: each sidecar's commit_fencing setting.
RECORD_COMMIT_FENCINGS = {"": types_pb2.COMMIT_FENCING_UNSPECIFIED, **COMMIT_FENCING_BY_NAME}


class GroupStore(Protocol):
    """The durable writes of a group (:class:`~services.assigner.state.StateStore` in the
    assigner). Each returns once Kafka acknowledged the record, or raises."""

    def put_group(self, record: GroupRecord) -> asyncio.Future[None]: ...

    def put_epochs(
        self,
        group: str,
        epochs: Iterable[tuple[TopicPartition, int]],
        holders: Mapping[TopicPartition, str] | None = None,
    ) -> asyncio.Future[None]:
        """Resolves once the epochs are durable; fails (never hangs) after a bounded time."""
        ...

    def put_binding(self, group: str, client_id: str) -> asyncio.Future[None]: ...

    def delete_binding(self, group: str, client_id: str) -> asyncio.Future[None]: ...

    def put_drain(self, group: str, sidecar_id: str, drained: bool) -> asyncio.Future[None]: ...

    def delete_group(
        self, group: str, clients: Iterable[str], drained: Iterable[str]
    ) -> asyncio.Future[None]: ...


# Client ids taken from one heartbeat: a sidecar tracks at most 10,000 (its
# metrics_max_client_ids), so more is not a sidecar's report.
MAX_REPORTED_CLIENTS = 10_000


def duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


@dataclass(frozen=True)
class MemberConfig:
    """What a member's last heartbeat said of the group's consumer config."""

    applied_version: int  # the version it runs; 0 = not reported
    rejection: tuple[int, str] | None = None  # the newest refused (version, reason)


# Messages one Session stream may have queued, unread by its sidecar; past it the sidecar
# is not reading (a stalled or hostile peer) and the session is closed, its queue freed
# (issue 37, finding 11). A healthy sidecar has a few heartbeat acks and grants queued.
MAX_QUEUED = 4096


@dataclass
class Connection:
    """One open Session stream of one sidecar, with an ordered outgoing pipeline.

    ``queue`` is what the Session handler writes to the stream. A message sent *after* an
    awaitable (a grant waiting for its epoch to be durable) holds back every later
    message of this stream until it is released, so the sidecar sees them in order; the
    awaitable's False (or an error) drops the message. Heartbeat acks go out at once
    (:meth:`send_now`): they only renew leases the sidecar named, and it cannot name a
    grant that is still held back."""

    member_id: str
    session_id: str
    # The identity that opened the stream (authorization on), else None.
    owner: str | None = None
    queue: asyncio.Queue[assigner_pb2.SessionResponse | None] = field(default_factory=asyncio.Queue)
    _pending: deque[tuple[Awaitable[bool] | None, assigner_pb2.SessionResponse]] = field(
        default_factory=deque
    )
    _pump: asyncio.Task[None] | None = None
    closed: bool = False

    def send(
        self, message: assigner_pb2.SessionResponse, after: Awaitable[bool] | None = None
    ) -> None:
        if self.closed:
            return
        if after is None and not self._pending:
            self._put(message)
            return
        self._pending.append((after, message))
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    def send_now(self, message: assigner_pb2.SessionResponse) -> None:
        """Ahead of held-back grants (see the class doc)."""
        if not self.closed:
            self._put(message)

    def _put(self, message: assigner_pb2.SessionResponse) -> None:
        if self.queue.qsize() < MAX_QUEUED:
            self.queue.put_nowait(message)
            return
        log.warning("session closed: its sidecar reads nothing", sidecar=self.member_id)
        while not self.queue.empty():
            self.queue.get_nowait()
        self.close()

    async def _run_pump(self) -> None:
        try:
            while self._pending and not self.closed:
                after, message = self._pending[0]
                send = True
                if after is not None:
                    try:
                        send = await asyncio.shield(after)
                    except Exception as exc:
                        # Not durable, so not sent: the coordinator took the grant back and
                        # decides again under a newer epoch.
                        log.warning(
                            "grant withheld: its epoch could not be persisted",
                            sidecar=self.member_id,
                            error=str(exc),
                        )
                        send = False
                if self.closed:
                    return  # the stream ended while the write was waited for (close cleared)
                self._pending.popleft()
                if send:
                    self._put(message)
        finally:
            self._pump = None

    def close(self) -> None:
        self.closed = True
        self._pending.clear()
        self.queue.put_nowait(None)


class GroupRuntime:
    def __init__(
        self,
        record: GroupRecord,
        partitions: Iterable[TopicPartition],
        settings: AssignerSettings,
        metrics: AssignerMetrics,
        state: GroupStore | None,
        *,
        epochs: dict[TopicPartition, int] | None = None,
        holders: dict[TopicPartition, str] | None = None,
        settle_until: float = 0.0,
        clients: Iterable[str] = (),
        drained: Iterable[str] = (),
        faults: FaultReporter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` times grant dispatch (the coordinator's clock)."""
        self.record = record
        self.clock = clock
        self.faults = GroupFaults(faults, record.name)
        self.settings = settings
        self.metrics = metrics
        self.state = state
        self.coordinator = GroupCoordinator(
            record.name,
            partitions,
            Timing(
                ttl=self.timing.ttl,
                grace=settings.lease_grace_seconds,
                hold_window=settings.hold_window_seconds,
                hold_mode=HoldMode(settings.hold_mode),
                # Events within a tick share one rebalance (a join storm: one per tick).
                rebalance_interval=settings.tick_seconds,
                reconnect_window=settings.lease_reconnect_window_seconds,
            ),
            epochs=epochs,
            holders=holders,
            settle_until=settle_until,
            strategy=Strategy(record.balance_strategy),
            grants_enabled=record.mode == "leased",
        )
        self.coordinator.drained = set(drained)
        # The operator's operation running on the group (an offset reset, a mode switch),
        # if any: one at a time (begin_operation).
        self.operation: str | None = None
        self.connections: dict[str, Connection] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.log = log.bind(group=record.name)
        self.bindings = GroupBindings(
            record.name,
            settings,
            metrics,
            self.faults,
            clients=clients,
            store=self._store_binding,
            members=self.coordinator.serving_members,
            holders=self._holders,
            clock=clock,
            log=self.log,
        )
        # Observability only (metrics and /ui), never read by a decision:
        # bytes/s per partition and per sidecar as last reported in heartbeats,
        # the first revoke time (monotonic) and epoch of each partition in handoff.
        self.partition_rates: dict[TopicPartition, float] = {}
        self.sidecar_rates: dict[str, float] = {}
        self._revoked_at: dict[TopicPartition, tuple[float, int]] = {}
        # The clients' recent totals per sidecar (heartbeats).
        self.client_activity = ClientActivity()
        # The group's consumer config as each member reports running it (DescribeGroup).
        self.member_configs: dict[str, MemberConfig] = {}
        # A live timing change rolling out: the TTL each config version told the members
        # (group_timing.rollout_ttl); one step when none is under way.
        self.timing_steps: tuple[TimingStep, ...] = (
            TimingStep(record.config_version, self.timing.ttl),
        )

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def seed(self) -> GroupSeed:
        return GroupSeed(
            name=self.record.name,
            topics=list(self.record.topics),
            mode=self.record.mode,
            consumer_config=dict(self.record.consumer_config),
            balance_strategy=self.record.balance_strategy,
            visibility_timeout_seconds=self.record.visibility_timeout_seconds,
            max_deliveries=self.record.max_deliveries,
            external_offset_changes=self.external_offset_changes,
            dead_letter_topic=self.record.dead_letter_topic,
            ordering=self.ordering,
            commit_fencing=self.commit_fencing,
        )

    @property
    def timing(self) -> GroupTiming:
        """The group's lease TTL and heartbeat interval: its own (a kafka-fenced group's
        choice, carried by its record) or the assigner's settings. A kafka-fenced
        group's may change live (:meth:`update`): members expire by the longer of the old
        and the new TTL until each reports the new config version (:meth:`_roll_timing`)."""
        return effective_timing(
            self.record.lease_ttl_seconds,
            self.record.heartbeat_interval_seconds,
            GroupTiming(self.settings.lease_ttl_seconds, self.settings.heartbeat_interval_seconds),
        )

    @property
    def commit_fencing(self) -> Literal["", "lease", "kafka"]:
        value = self.record.commit_fencing
        return "lease" if value == "lease" else "kafka" if value == "kafka" else ""

    @property
    def ordering(self) -> Literal["unordered", "key", "partition"]:
        value = self.record.ordering
        return "key" if value == "key" else "partition" if value == "partition" else "unordered"

    @property
    def external_offset_changes(self) -> Literal["follow", "revert", "ignore"]:
        value = self.record.external_offset_changes
        return "revert" if value == "revert" else "ignore" if value == "ignore" else "follow"

    def config_proto(self) -> types_pb2.GroupConfig:
        config = types_pb2.GroupConfig(
            name=self.record.name,
            topics=list(self.record.topics),
            mode=MODE_BY_NAME[self.record.mode],
            consumer_config=dict(self.record.consumer_config),
            lease_ttl=duration(self.timing.ttl),
            heartbeat_interval=duration(self.timing.heartbeat),
            balance_strategy=BALANCE_STRATEGY_BY_NAME[self.record.balance_strategy],
            config_version=self.record.config_version,
            max_deliveries=self.record.max_deliveries,
            external_offset_changes=EXTERNAL_CHANGE_BY_NAME[self.record.external_offset_changes],
            dead_letter_topic=self.record.dead_letter_topic,
            ordering=ORDERING_BY_NAME[self.record.ordering],
            commit_fencing=RECORD_COMMIT_FENCINGS[self.record.commit_fencing],
        )
        if self.record.visibility_timeout_seconds is not None:
            config.visibility_timeout.CopyFrom(duration(self.record.visibility_timeout_seconds))
        return config

    # ---- sessions ---------------------------------------------------------------------

    def attach(
        self, join: assigner_pb2.SessionJoin, now: float, owner: str | None = None
    ) -> Connection:
        """A Session stream of ``join.sidecar_id``, opened by ``owner`` (its identity, when
        authorization is on). A re-attach replaces the sidecar's open stream, unless that
        stream is live and another identity holds it: DsError SESSION_HELD, and the holder
        keeps its stream and its leases."""
        self.check_owner(join.sidecar_id, owner)
        previous = self.connections.get(join.sidecar_id)
        if previous is not None:
            del self.connections[join.sidecar_id]
            previous.close()  # a re-attach replaces the old stream
        conn = Connection(join.sidecar_id, uuid.uuid4().hex, owner=owner)
        self.connections[join.sidecar_id] = conn
        conn.send(
            assigner_pb2.SessionResponse(
                accepted=assigner_pb2.SessionAccepted(
                    session_id=conn.session_id,
                    lease_ttl=duration(self.timing.ttl),
                    heartbeat_interval=duration(self.timing.heartbeat),
                    mode=MODE_BY_NAME[self.record.mode],
                    consumer_config=dict(self.record.consumer_config),
                    config_version=self.record.config_version,
                    topics=list(self.record.topics),
                    visibility_timeout=self._visibility(),
                    max_deliveries=self.record.max_deliveries,
                    external_offset_changes=EXTERNAL_CHANGE_BY_NAME[
                        self.record.external_offset_changes
                    ],
                    dead_letter_topic=self.record.dead_letter_topic,
                    ordering=ORDERING_BY_NAME[self.record.ordering],
                    commit_fencing=RECORD_COMMIT_FENCINGS[self.record.commit_fencing],
                )
            )
        )
        member = MemberInfo(
            id=join.sidecar_id,
            endpoint=join.endpoint,
            session_id=conn.session_id,
            zone=join.zone or None,
            capacity=join.capacity or None,
            local_endpoint=join.local_endpoint,
        )
        held = [HeldLease(TopicPartition(h.topic, h.partition), h.epoch) for h in join.held_leases]
        outcome = self.coordinator.join(member, held, now)
        self.faults.joined(join.sidecar_id)
        self.log.info(
            "sidecar joined",
            sidecar=join.sidecar_id,
            endpoint=join.endpoint,
            held=len(held),
            kept=len(outcome.renewed),
        )
        # Leases kept or adopted on (re-)attach are renewed by the sidecar's next heartbeat,
        # which it sends as soon as it is accepted.
        self.apply(outcome, refresh=True)
        return conn

    def check_owner(self, sidecar_id: str, owner: str | None) -> None:
        """DsError SESSION_HELD if a live session of another identity than ``owner`` holds
        ``sidecar_id``: a Session or a Leave of it is the holder's alone (issue 37,
        finding 4). None (authorization off) owns nothing and is refused nothing."""
        live = self.connections.get(sidecar_id)
        if live is not None and not live.closed and live.owner is not None and live.owner != owner:
            raise DsError(
                Reason.SESSION_HELD,
                f"sidecar id {sidecar_id!r} is held by a live session of another identity",
                metadata={"sidecar_id": sidecar_id, "group": self.record.name},
            )

    def detach(self, conn: Connection) -> None:
        """The stream ended. Not a lost lease: the member lives until its TTL runs out, or
        is gone after the reconnect window if the sidecar ended it (:meth:`disconnected`)."""
        if self.connections.get(conn.member_id) is conn:
            del self.connections[conn.member_id]

    def disconnected(self, conn: Connection, now: float) -> None:
        """The sidecar's side of ``conn`` ended (not the assigner's: a replaced, rejoined
        or overflowing stream is closed here first and is not this). If it does not
        attach again within the reconnect window, it is gone and its Kafka-fenced leases
        move at once (coordinator.disconnected)."""
        if self.connections.get(conn.member_id) is not conn:
            return
        self.log.info("sidecar's session ended without a leave", sidecar=conn.member_id)
        self.apply(self.coordinator.disconnected(conn.member_id, now))

    def heartbeat(self, conn: Connection, hb: assigner_pb2.SessionHeartbeat, now: float) -> None:
        progress = [
            Progress(
                TopicPartition(p.topic, p.partition),
                p.epoch,
                p.committed_offset,
                bytes_per_second=p.bytes_per_second,
                lag=p.lag,
                kafka_fenced=p.fenced_by_kafka,
            )
            for p in hb.leases
        ]
        released = [
            Released(TopicPartition(r.topic, r.partition), r.epoch, r.committed_offset)
            for r in hb.released_leases
        ]
        outcome = self.coordinator.heartbeat(conn.member_id, progress, released, now)
        self.metrics.heartbeats.inc()
        self._observe_config(conn.member_id, hb)
        self._observe_progress(conn.member_id, progress, outcome)
        self._observe_clients(conn.member_id, hb, now)
        conn.send_now(self._ack(hb.seq, outcome))
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

    def _observe_progress(
        self, member_id: str, progress: Iterable[Progress], outcome: Outcome
    ) -> None:
        """Metrics from a heartbeat: bytes/s of the member's renewed leases, and the end
        of each handoff whose new holder now renews the partition under its new epoch."""
        renewed = {h.tp: h.epoch for h in outcome.renewed}
        rate = 0.0
        for p in progress:
            if renewed.get(p.tp) == p.epoch:
                self.partition_rates[p.tp] = p.bytes_per_second
                rate += p.bytes_per_second
        if member_id in self.bindings.holders_seen:  # not for a member that is leaving or gone
            self.sidecar_rates[member_id] = rate
            self.metrics.set_sidecar_rate(self.name, member_id, rate)
        if self._revoked_at:
            now = time.monotonic()
            for tp, epoch in renewed.items():
                started = self._revoked_at.get(tp)
                if started is not None and epoch > started[1]:
                    del self._revoked_at[tp]
                    self.metrics.handoff_latency.labels(self.name).observe(now - started[0])

    def _observe_clients(
        self, member_id: str, hb: assigner_pb2.SessionHeartbeat, now: float
    ) -> None:
        """A heartbeat's client totals; what no sidecar sends (a negative count, a time
        that is no time) is taken as 0, past :data:`MAX_REPORTED_CLIENTS` as absent. A
        bound client a sidecar reports *active* is alive (its binding renewed): a stream of
        it open there, or a request since that sidecar's previous report. A sidecar reports
        every client it still tracks, so a client killed with kill -9 after it read stayed
        "reported" and its binding never expired (seen: 50 of 50 after 30 s, window 5 s)."""
        for c in hb.clients[:MAX_REPORTED_CLIENTS]:
            if c.client_id in self.bindings.client_seen and self._reported_active(member_id, c):
                self.bindings.renew(c.client_id, now)
        self.client_activity.observe(
            member_id,
            {
                c.client_id: Totals(
                    records=max(0, c.records_served),
                    acks=max(0, c.acks),
                    errors=max(0, c.errors),
                    requests=max(0, c.requests),
                    last_seen=c.last_seen_seconds
                    if math.isfinite(c.last_seen_seconds) and c.last_seen_seconds > 0
                    else 0.0,
                    active_streams=max(0, c.active_streams),
                )
                for c in hb.clients[:MAX_REPORTED_CLIENTS]
            },
            now,
        )

    def _reported_active(self, member_id: str, c: assigner_pb2.ClientActivity) -> bool:
        """Whether a sidecar's report shows ``c`` at work: a stream open, or more requests
        than its previous report (the first report counts: the client was just seen)."""
        if c.active_streams > 0:
            return True
        before = self.client_activity.latest(member_id, c.client_id)
        return before is None or c.requests > before.requests

    def client_rows(self) -> list[ClientRow]:
        """The group's clients (bound or seen by a member) with their rates per sidecar."""
        members = self.coordinator.live_members()
        self.client_activity.retain(m.id for m in members)
        return client_rows(
            self.name,
            self.client_activity,
            {c: self.bindings.bound_since.get(c, 0.0) for c in self.clients},
            {m.id: m.endpoint for m in members},
        )

    def _observe_config(self, member_id: str, hb: assigner_pb2.SessionHeartbeat) -> None:
        """The group's consumer config as the member runs it; its refusals are faults."""
        rejection = None
        if hb.HasField("config_rejection"):
            rejection = (hb.config_rejection.config_version, hb.config_rejection.reason)
        reported = MemberConfig(hb.applied_config_version, rejection)
        if self.member_configs.get(member_id) != reported:
            self.member_configs[member_id] = reported
            self.faults.config_status(member_id, reported.applied_version, rejection)
            self._roll_timing()

    def _forget_member(self, member_id: str) -> None:
        self.member_configs.pop(member_id, None)
        self.faults.gone(member_id)
        self._roll_timing()

    def _roll_timing(self) -> None:
        """The TTL the coordinator expires members by while a timing change rolls out:
        never shorter than what a member not yet running the new version was told."""
        if len(self.timing_steps) == 1:
            return  # no change under way
        ttl, self.timing_steps = rollout_ttl(
            self.timing_steps,
            {m: c.applied_version or None for m, c in self.member_configs.items()},
            # A member held for its return expires by its hold window, not the TTL.
            [m.id for m in self.coordinator.members.values() if m.held_until is None],
        )
        if len(self.timing_steps) == 1:
            self.log.info("group timing rolled out", ttl=ttl, heartbeat=self.timing.heartbeat)
        self.coordinator.set_ttl(ttl)

    @staticmethod
    def _ack(seq: int, outcome: Outcome) -> assigner_pb2.SessionResponse:
        return assigner_pb2.SessionResponse(
            heartbeat_ack=assigner_pb2.HeartbeatAck(
                seq=seq,
                renewed_leases=[
                    types_pb2.LeaseRef(topic=h.tp.topic, partition=h.tp.partition, epoch=h.epoch)
                    for h in outcome.renewed
                ],
            )
        )

    def leave(self, member_id: str, now: float) -> float:
        """Graceful leave; returns the hold window the member's partitions are kept for."""
        self.log.info("sidecar leaving", sidecar=member_id)
        self.faults.left(member_id)
        self._forget_member(member_id)
        self.apply(self.coordinator.leave(member_id, now))
        return self.coordinator.timing.hold_window

    def abandon(self, member_id: str, now: float) -> None:
        self.log.info("sidecar left without handing off", sidecar=member_id)
        self.faults.left(member_id, graceful=False)
        self._forget_member(member_id)
        self.apply(self.coordinator.abandon(member_id, now))

    def move_lease(self, tp: TopicPartition, target: str, now: float) -> None:
        self.log.info("moving lease", topic=tp.topic, partition=tp.partition, target=target)
        self.apply(self.coordinator.move(tp, target, now))

    def due(self) -> float:
        """When :meth:`tick` next has work (monotonic seconds): a coordinator deadline or
        the next sweep of the bindings."""
        return min(self.coordinator.due(), self.bindings.next_sweep)

    def tick(self, now: float) -> None:
        self.bindings.expire(now)
        outcome = self.coordinator.disconnect_expired(now)
        for member_id in outcome.lost:
            self.log.warning("sidecar lost: no heartbeat within TTL + grace", sidecar=member_id)
            self.faults.lost(member_id)
            self._forget_member(member_id)
            conn = self.connections.pop(member_id, None)
            if conn is not None:
                conn.close()
        for member_id in outcome.disconnected:
            self.log.warning(
                "sidecar gone: its session ended without a leave and it did not attach "
                "again within the reconnect window",
                sidecar=member_id,
            )
            self.faults.disconnected(member_id)
            self._forget_member(member_id)
        for member_id in outcome.held_expired:
            # Under reserve its partitions move now; under handoff they moved at its leave.
            self.log.info(
                "hold window over: the sidecar's place is given up",
                sidecar=member_id,
                hold_mode=self.coordinator.timing.hold_mode.value,
            )
        self.apply(outcome)

    def set_partitions(self, partitions: Iterable[TopicPartition], now: float) -> None:
        before = len(self.coordinator.leases)
        self.coordinator.set_partitions(partitions)
        if len(self.coordinator.leases) != before:
            self.log.info("partitions added", total=len(self.coordinator.leases))
            self.apply(self.coordinator.disconnect_expired(now))

    def update(self, record: GroupRecord) -> None:
        """A new configuration (UpdateGroup): every new config version goes to every
        sidecar at once (ConfigUpdate, with the consumer config and the redelivery settings),
        so each reports running the group's current version whatever field changed and
        applies a new visibility timeout or delivery limit live; a sidecar replaces its
        consumer only if the consumer config itself changed. A new mode is only recorded
        here: whether leases are granted is the mode switch's to decide
        (:mod:`services.assigner.mode_switch`), in step with the sidecars."""
        # A mode switch re-joins every sidecar (rejoin_all), and each SessionAccepted
        # carries the new version: no ConfigUpdate on a stream about to end.
        new_version = (
            record.config_version != self.record.config_version and record.mode == self.record.mode
        )
        before = self.timing
        self.record = record
        self.coordinator.strategy = Strategy(record.balance_strategy)
        self._persist_group()
        if self.timing != before:
            self.timing_steps = start_rollout(
                self.timing_steps, record.config_version, self.timing.ttl
            )
            self.log.info(
                "group timing changing",
                ttl=self.timing.ttl,
                heartbeat=self.timing.heartbeat,
                version=record.config_version,
            )
            self._roll_timing()
        if new_version:
            update = assigner_pb2.SessionResponse(
                config_update=assigner_pb2.ConfigUpdate(
                    lease_ttl=duration(self.timing.ttl),
                    heartbeat_interval=duration(self.timing.heartbeat),
                    consumer_config=dict(record.consumer_config),
                    config_version=record.config_version,
                    visibility_timeout=self._visibility(),
                    max_deliveries=record.max_deliveries,
                    external_offset_changes=EXTERNAL_CHANGE_BY_NAME[record.external_offset_changes],
                    dead_letter_topic=record.dead_letter_topic,
                    ordering=ORDERING_BY_NAME[record.ordering],
                    commit_fencing=RECORD_COMMIT_FENCINGS[record.commit_fencing],
                )
            )
            for conn in self.connections.values():
                conn.send(update)

    def _visibility(self) -> duration_pb2.Duration | None:
        """The group's visibility timeout as sent to sidecars; None (unset) = theirs."""
        seconds = self.record.visibility_timeout_seconds
        return None if seconds is None else duration(seconds)

    # ---- operations: drains, the mode switch's re-join, one operation at a time --------

    async def set_drained(self, member_id: str, drained: bool, now: float) -> None:
        """Drain a member (or end its drain): durable first, then its leases move."""
        if self.state is not None:
            await self.state.put_drain(self.name, member_id, drained)
        self.log.info("sidecar drained" if drained else "sidecar undrained", sidecar=member_id)
        self.apply(self.coordinator.set_drained(member_id, drained, now))

    async def persist_epochs(self, epochs: dict[TopicPartition, int]) -> None:
        """Epochs made outside a grant (an offset reset's), durable before they are used."""
        if self.state is not None and epochs:
            await self.state.put_epochs(self.name, sorted(epochs.items()))

    def rejoin_all(self) -> None:
        """End every sidecar's Session stream: each re-joins at once and learns the group's
        mode and config from its SessionAccepted (a mode switch). Membership and leases
        are untouched: a broken stream is not a lost member."""
        for conn in list(self.connections.values()):
            conn.close()

    def check_idle(self) -> None:
        """OPERATION_IN_PROGRESS while an operation (an offset reset, a mode switch) runs."""
        if self.operation is not None:
            raise DsError(
                Reason.OPERATION_IN_PROGRESS,
                f"group {self.name!r}: {self.operation} is in progress; retry once it is done",
                metadata={"group": self.name, "operation": self.operation},
            )

    def begin_operation(self, name: str) -> None:
        """Mark ``name`` as running on the group; OPERATION_IN_PROGRESS if another one is."""
        self.check_idle()
        self.operation = name

    def end_operation(self) -> None:
        self.operation = None

    def in_background(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run an operation that must not stop halfway when its caller gives up (a call's
        deadline): it runs to its end unless the group closes."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ---- bindings (services/assigner/bindings.py) ------------------------------------

    @property
    def clients(self) -> set[str]:
        return self.bindings.clients

    def _store_binding(self, client_id: str, bound: bool) -> None:
        if self.state is not None:
            store = self.state.put_binding if bound else self.state.delete_binding
            self._track(store(self.name, client_id))

    def _persist_group(self) -> None:
        if self.state is not None:
            self._track(self.state.put_group(self.record))

    def _track(self, future: Awaitable[None]) -> None:
        async def wait() -> None:
            try:
                await future
            except Exception as exc:
                self.log.error("state write failed", error=str(exc))

        task = asyncio.get_running_loop().create_task(wait())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def close(self) -> None:
        for conn in list(self.connections.values()):
            conn.close()
        self.connections.clear()
        for task in list(self._background):
            task.cancel()
        self.bindings.close()

    # ---- commands and bindings ----------------------------------------------------------

    def apply(self, outcome: Outcome, *, refresh: bool | None = None) -> None:
        """Send the outcome's commands; refresh bindings and metrics when holders may have
        changed (not on a plain heartbeat: that would cost O(members x partitions) each)."""
        grants = [c for c in outcome.commands if isinstance(c, GrantCmd)]
        gates = self._grant_gates(grants)
        for cmd in outcome.commands:
            self._dispatch(cmd, gates.get(cmd) if isinstance(cmd, GrantCmd) else None)
        if outcome.expired:
            self.metrics.expiries.labels(self.name).inc(len(outcome.expired))
        if refresh is None:
            refresh = bool(
                outcome.commands or outcome.membership_changed or outcome.lost
                or outcome.held_expired
            )  # fmt: skip
        if refresh:
            self.faults.granted(
                [(g.tp, g.member) for g in grants], self.coordinator.leases.values()
            )
            holders = self._holders()
            self.bindings.publish_if_changed(holders)
            self.metrics.set_distribution(self.name, {m: len(t) for m, t in holders.items()})
            for gone in set(self.sidecar_rates) - set(holders):
                del self.sidecar_rates[gone]

    # ---- grants: durable first, then sent only if still current ----------------------

    def _grant_gates(self, grants: list[GrantCmd]) -> dict[Command, Awaitable[bool]]:
        """Per grant, what its message waits for: True once its epoch is durable and the
        coordinator still counts it as current (its expiry then runs from now), False if
        the write failed (the grant is taken back) or the lease moved on meanwhile."""
        if not grants or self.state is None:
            return {}  # nothing to persist: sent as decided, expiry from the decision
        loop = asyncio.get_running_loop()
        gates: dict[Command, asyncio.Future[bool]] = {g: loop.create_future() for g in grants}
        durable = self.state.put_epochs(
            self.name, [(g.tp, g.epoch) for g in grants], {g.tp: g.member for g in grants}
        )

        def settled(future: asyncio.Future[None]) -> None:
            self._settle_grants(gates, None if future.cancelled() else future.exception())

        durable.add_done_callback(settled)
        return dict(gates)

    def _settle_grants(
        self, gates: dict[Command, asyncio.Future[bool]], error: BaseException | None
    ) -> None:
        now = self.clock()
        for cmd, gate in gates.items():
            assert isinstance(cmd, GrantCmd)
            if error is not None:
                self.coordinator.withheld(cmd.tp, cmd.epoch, cmd.member)
                self.metrics.grants_withheld.labels(self.name, "write_failed").inc()
                send = False
            else:
                send = self.coordinator.dispatched(cmd.tp, cmd.epoch, cmd.member, now)
                if not send:
                    self.metrics.grants_withheld.labels(self.name, "superseded").inc()
                    self.log.info(
                        "grant not sent: its lease lapsed or moved while its epoch was written",
                        topic=cmd.tp.topic, partition=cmd.tp.partition, epoch=cmd.epoch,
                        sidecar=cmd.member,
                    )  # fmt: skip
            if not gate.done():
                gate.set_result(send)
        if error is not None:
            self.log.warning(
                "grants taken back: their epochs could not be written",
                grants=len(gates), error=str(error),
            )  # fmt: skip

    def _dispatch(self, cmd: Command, after: Awaitable[bool] | None) -> None:
        conn = self.connections.get(cmd.member)
        if isinstance(cmd, GrantCmd):
            self.metrics.grants.labels(self.name).inc()
            message = assigner_pb2.SessionResponse(
                grant=assigner_pb2.LeaseGrant(
                    topic=cmd.tp.topic,
                    partition=cmd.tp.partition,
                    epoch=cmd.epoch,
                    start_offset=cmd.start_offset,
                )
            )
        else:
            assert isinstance(cmd, RevokeCmd)
            self.metrics.revokes.labels(self.name).inc()
            if cmd.reason not in (RevokeWhy.FENCED, RevokeWhy.RESET):  # not a handoff
                self._revoked_at.setdefault(cmd.tp, (time.monotonic(), cmd.epoch))
            # A reset pauses the partition: the holder drops what is in flight at once
            # (acks of it are refused as stale from now on) instead of waiting for it.
            drain = 0.0 if cmd.reason is RevokeWhy.RESET else self.settings.drain_timeout_seconds
            message = assigner_pb2.SessionResponse(
                revoke=assigner_pb2.LeaseRevoke(
                    topic=cmd.tp.topic,
                    partition=cmd.tp.partition,
                    epoch=cmd.epoch,
                    reason=_REVOKE_REASONS[cmd.reason],
                    drain_timeout=duration(drain),
                )
            )
        if conn is None:
            # No open stream: the command is re-derived when the sidecar re-attaches, or
            # the lease lapses at its expiry (coordinator rules); nothing is lost.
            self.log.info("command for a detached sidecar deferred", sidecar=cmd.member)
            return
        conn.send(message, after)

    def _holders(self) -> dict[str, tuple[TopicPartition, ...]]:
        """Serving member -> the partitions it holds, in one pass over the leases."""
        by_holder: dict[str, list[TopicPartition]] = {
            m.id: [] for m in self.coordinator.serving_members()
        }
        for tp, lease in sorted(self.coordinator.leases.items()):
            if lease.holder in by_holder:
                by_holder[lease.holder].append(tp)
        return {m: tuple(tps) for m, tps in by_holder.items()}
