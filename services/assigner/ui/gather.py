"""Data for the pages, read from the live groups on the event loop (the I/O side of /ui).

Offsets come from the same :class:`~services.assigner.offsets_view.OffsetsView` that
``AdminService.DescribeGroup`` uses (same cache, same lag and lag-seconds rules), so the
page and DescribeGroup agree. Broker leaders come from Kafka metadata, recent faults from
the notifier's ``ListFaults``. Every coroutine here runs on the assigner's loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc.aio
import structlog
from confluent_kafka import KafkaException

from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dsclient.connection import open_aio_channel
from dsclient.reasons import DsError
from services.assigner.admin.validation import validate_group_name
from services.assigner.coordinator import Lease, LeaseState
from services.assigner.groups import GroupRuntime
from services.assigner.kafka_cluster import KafkaCluster
from services.assigner.leadership import Replica
from services.assigner.metrics import imbalance_ratio
from services.assigner.offsets import lag_seconds, total_lag
from services.assigner.offsets_view import OffsetsView
from services.assigner.registry import GroupRegistry
from services.assigner.settings import AssignerSettings
from services.assigner.ui.history import LagHistory
from services.assigner.ui.model import (
    BindingRow,
    BrokerLoad,
    ClientsView,
    DistributionView,
    FaultRow,
    Faults,
    GroupDistribution,
    GroupSummary,
    IndexView,
    LagView,
    NotLeader,
    Page,
    PartitionRow,
    SidecarLoad,
)
from services.runtime.discovery import make_discovery
from services.runtime.faults import short_severity, short_state, short_type
from services.runtime.lag import Status, group_status
from services.runtime.topic_partition import TopicPartition

log = structlog.get_logger(__name__)

LAG_SAMPLE_SECONDS = 5.0
OFFSETS_WAIT_SECONDS = 3.0
TIMESTAMPS_WAIT_SECONDS = 1.0
NOTIFIER_TIMEOUT_SECONDS = 2.0
FAULTS_SHOWN = 20
_STATES = {LeaseState.GRANTED: "granted", LeaseState.REVOKING: "revoking", LeaseState.FREE: "free"}


def _key(tp: TopicPartition) -> str:
    return f"{tp.topic}/{tp.partition}"


@dataclass(frozen=True)
class UiSources:
    """What the pages read: the live groups, their offsets (the view DescribeGroup uses),
    Kafka's metadata, this replica, the settings (Consul, notifier) and the clock."""

    groups: GroupRegistry
    offsets: OffsetsView
    cluster: KafkaCluster
    replica: Replica
    settings: AssignerSettings
    service: str  # this service's name in discovery (for the leader's /ui link)
    clock: Callable[[], float] = time.monotonic


class UiData:
    """Builds the pages' data from :class:`UiSources`."""

    def __init__(self, sources: UiSources, history: LagHistory) -> None:
        self.groups = sources.groups
        self.offsets = sources.offsets
        self.cluster = sources.cluster
        self.replica = sources.replica
        self.settings = sources.settings
        self.service = sources.service
        self.clock = sources.clock
        self.history = history
        self._notifier: tuple[str, grpc.aio.Channel] | None = None

    def page(self) -> Page:
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return Page(instance=self.replica.address, generated_at=now)

    async def not_leader(self) -> NotLeader | None:
        """None while this replica leads and serves; else who does."""
        if self.groups.serving:
            return None
        leader = self.replica.leader_address
        return NotLeader(self.page(), leader, await self._leader_ui(leader))

    async def _leader_ui(self, leader: str | None) -> str | None:
        """The leader's /ui URL: its HTTP port is in its Consul registration's meta."""
        if leader is None or not self.settings.consul:
            return None
        try:
            _index, instances = await make_discovery(self.settings.consul).healthy(self.service)
        except Exception:
            return None
        for instance in instances:
            if instance.endpoint == leader and instance.meta.get("http_port"):
                return f"http://{instance.address}:{instance.meta['http_port']}/ui"
        return None

    # ---- index --------------------------------------------------------------------------

    async def index(self) -> IndexView:
        groups = list(self.groups)
        read = await self.offsets.many(
            {g.name: sorted(g.coordinator.leases) for g in groups}, OFFSETS_WAIT_SECONDS
        )
        errors = sorted({str(r.message) for r in read.values() if isinstance(r, DsError)})
        summaries = []
        for g in groups:
            offsets = read.get(g.name)
            total = -1 if offsets is None or isinstance(offsets, DsError) else total_lag(offsets)
            summaries.append(
                GroupSummary(
                    name=g.name,
                    mode=g.record.mode,
                    strategy=g.record.balance_strategy,
                    sidecars=len(g.coordinator.live_members()),
                    partitions=len(g.coordinator.leases),
                    clients=len(g.clients),
                    total_lag=total,
                )
            )
        return IndexView(self.page(), tuple(summaries), "; ".join(errors))

    # ---- distribution ------------------------------------------------------------------

    async def distribution(self) -> DistributionView:
        groups = list(self.groups)
        topics = sorted({t for g in groups for t in g.record.topics})
        leaders: dict[TopicPartition, int] = {}
        hosts: dict[int, str] = {}
        broker_error = ""
        if topics:
            try:
                leaders, hosts = await asyncio.to_thread(self.cluster.broker_leaders, topics)
            except KafkaException as exc:
                broker_error = f"cannot read Kafka metadata: {exc}"
        return DistributionView(
            self.page(),
            tuple(_group_distribution(g, leaders, hosts) for g in groups),
            broker_error,
        )

    # ---- lag ----------------------------------------------------------------------------

    async def lag(self, name: str) -> LagView:
        """Raises DsError (GROUP_NOT_FOUND, KAFKA_UNAVAILABLE) as DescribeGroup would."""
        validate_group_name("group", name)
        group = self.groups.group(name)
        partitions = sorted(group.coordinator.leases)
        offsets = await self.offsets.group(group.name, partitions, OFFSETS_WAIT_SECONDS)
        starts = {tp: max(o.committed, o.earliest) for tp, o in offsets.items() if o.lag > 0}
        oldest = await self.offsets.oldest_timestamps(starts, TIMESTAMPS_WAIT_SECONDS)
        now_wall, now_mono = time.time(), self.clock()
        rows = []
        statuses = []
        for tp, o in sorted(offsets.items()):
            lease = group.coordinator.leases.get(tp)
            status = self.history.status(group.name, tp, now_mono)
            statuses.append(status)
            rows.append(
                PartitionRow(
                    topic=tp.topic,
                    partition=tp.partition,
                    holder=(lease.holder or "") if lease else "",
                    epoch=lease.epoch if lease else 0,
                    state=_STATES[lease.state] if lease else "free",
                    committed=o.committed,
                    end=o.end,
                    lag_records=o.lag,
                    lag_seconds=lag_seconds(o.lag, oldest.get(tp), now_wall),
                    status=status.name,
                    trend=tuple(self.history.trend(group.name, tp)),
                    bytes_per_second=group.partition_rates.get(tp, 0.0)
                    if lease and lease.holder
                    else 0.0,
                    committed_by=o.committed_by,
                )
            )
        overall = group_status(s for s in statuses if s is not Status.NOTFOUND)
        return LagView(
            page=self.page(),
            group=group.name,
            status=overall.name if rows else Status.NOTFOUND.name,
            partitions=tuple(rows),
            bindings=_bindings(group),
            faults=await self.faults(group.name),
            sample_seconds=LAG_SAMPLE_SECONDS,
        )

    # ---- clients ------------------------------------------------------------------------

    async def clients(self, name: str) -> ClientsView:
        """Every group's clients, or one group's (DsError GROUP_NOT_FOUND as ListClients)."""
        if name:
            validate_group_name("group", name)
            groups = [self.groups.group(name)]
        else:
            groups = list(self.groups)
        rows = tuple(row for g in groups for row in g.client_rows())
        return ClientsView(self.page(), name, rows, time.time())

    async def faults(self, group: str) -> Faults:
        address = self.settings.notifier
        if not address:
            return Faults(note="notifier not configured (--notifier HOST:PORT)")
        try:
            stub = notifier_pb2_grpc.NotifierServiceStub(self._channel(address))
            response = await stub.ListFaults(
                notifier_pb2.ListFaultsRequest(group=group, page_size=FAULTS_SHOWN),
                timeout=NOTIFIER_TIMEOUT_SECONDS,
            )
        except grpc.aio.AioRpcError as exc:
            return Faults(note=f"notifier {address} did not answer: {exc.code().name}")
        rows = tuple(
            FaultRow(
                detected_at=f.detected_at.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")
                if f.HasField("detected_at")
                else "",
                type=short_type(f.type),
                state=short_state(f.state),
                severity=short_severity(f.severity),
                source=f"{f.source_service} {f.source_instance}".strip(),
                message=f.message,
            )
            for f in response.faults
        )
        return Faults(rows=rows)

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self._notifier is None or self._notifier[0] != address:
            self._notifier = (address, open_aio_channel(address, self.settings.connection))
        return self._notifier[1]

    async def close(self) -> None:
        if self._notifier is not None:
            await self._notifier[1].close(None)
            self._notifier = None


def _group_distribution(
    group: GroupRuntime, leaders: dict[TopicPartition, int], hosts: dict[int, str]
) -> GroupDistribution:
    coordinator = group.coordinator
    members = coordinator.serving_members()
    held: dict[str, list[str]] = {m.id: [] for m in members}
    unassigned: list[str] = []
    by_broker: dict[int, list[str]] = {}
    for tp, lease in sorted(coordinator.leases.items()):
        if _serving(lease) and lease.holder in held:
            held[lease.holder].append(_key(tp))
        else:
            unassigned.append(_key(tp))
        if tp in leaders:
            by_broker.setdefault(leaders[tp], []).append(_key(tp))
    sidecars = tuple(
        SidecarLoad(
            sidecar_id=m.id,
            endpoint=m.endpoint,
            zone=m.zone or "",
            partitions=tuple(held[m.id]),
            bytes_per_second=group.sidecar_rates.get(m.id, 0.0),
        )
        for m in members
    )
    brokers = tuple(
        BrokerLoad(broker_id=b, host=hosts.get(b, "?"), partitions=tuple(tps))
        for b, tps in sorted(by_broker.items())
    )
    return GroupDistribution(
        name=group.name,
        mode=group.record.mode,
        strategy=group.record.balance_strategy,
        sidecars=sidecars,
        brokers=brokers,
        unassigned=tuple(unassigned),
        imbalance=imbalance_ratio({s.sidecar_id: len(s.partitions) for s in sidecars}),
    )


def _serving(lease: Lease) -> bool:
    """Held right now (granted, or revoking while its holder drains)."""
    return lease.holder is not None and lease.state is not LeaseState.FREE


def _bindings(group: GroupRuntime) -> tuple[BindingRow, ...]:
    rows = []
    for client in sorted(group.clients):
        binding = group.bindings.binding_for(client)
        rows.append(
            BindingRow(
                client_id=client,
                sidecars=tuple(f"{e.sidecar_id}@{e.address}" for e in binding.endpoints),
            )
        )
    return tuple(rows)


class LagSampler:
    """The leader's timer: every ``interval`` seconds, each group's committed and end
    offsets go into the lag history (the sparkline and Burrow's windows)."""

    def __init__(
        self,
        groups: GroupRegistry,
        offsets: OffsetsView,
        history: LagHistory,
        *,
        interval: float = LAG_SAMPLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.groups = groups
        self.offsets = offsets
        self.history = history
        self.interval = interval
        self.clock = clock

    async def run(self) -> None:
        # The first sample one interval after election: the new leader's first reads
        # (DescribeGroup, the state topic) go first, and the trend starts from a settled
        # point.
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sample_once()
            except Exception:
                log.exception("lag sample failed")

    async def sample_once(self) -> None:
        groups = {g.name: sorted(g.coordinator.leases) for g in self.groups}
        self.history.retain(set(groups))
        if not groups:
            return
        read = await self.offsets.many(groups, OFFSETS_WAIT_SECONDS)
        now = self.clock()
        for name, offsets in read.items():
            if isinstance(offsets, DsError):
                log.debug("lag sample skipped", group=name, error=offsets.message)
                continue
            for tp, o in offsets.items():
                self.history.add(name, tp, o.committed, o.end, o.lag, now)
