"""Assigner wiring and lifecycle: groups, the tick loop, Kafka metadata, servicers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence

import structlog
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry, ProcessCollector

from dataservice.assigner.v1 import admin_pb2_grpc, assigner_pb2_grpc, binding_pb2_grpc
from services.assigner.balancer import TopicPartition
from services.assigner.faults import report_failover
from services.assigner.groups import GroupRuntime
from services.assigner.leader_guard import LeaderGuard
from services.assigner.leadership import (
    ElectionSettings,
    LeaderElector,
    Leadership,
    StaticLeadership,
    Unelected,
)
from services.assigner.metrics import AssignerMetrics
from services.assigner.offsets_view import OffsetsView
from services.assigner.rpc import AdminServicer, AssignerServicer, BindingServicer
from services.assigner.settings import AssignerSettings
from services.assigner.state import GroupRecord, StateStore
from services.assigner.ui.gather import LagSampler, UiData
from services.assigner.ui.history import LagHistory
from services.assigner.ui.routes import UiRoutes
from services.runtime.errors import DsError, Reason
from services.runtime.grpcserver import GrpcServer, GrpcService
from services.runtime.http import Route
from services.runtime.kafka import KafkaProbe, new_admin
from services.runtime.lifecycle import Dependency
from services.runtime.reporter import reporter_for

log = structlog.get_logger(__name__)


class AssignerApp:
    name = "ds-assigner"

    def __init__(self, settings: AssignerSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.metrics = AssignerMetrics(self.registry)
        self.faults = reporter_for(settings, "assigner", settings.advertised, self.registry)
        self.groups: dict[str, GroupRuntime] = {}
        self._admin = new_admin(settings, client_id="ds-assigner")
        self._probe = KafkaProbe(settings, client_id="ds-assigner", admin=self._admin)
        self._tasks: list[asyncio.Task[None]] = []
        self.state = StateStore(settings, topic=settings.state_topic, admin=self._admin)
        self.leading = False
        # Replaced in on_ready, once the bound port (the advertised address) is known.
        self.leadership: Leadership = Unelected()
        self.leader_guard = LeaderGuard(lambda: self.leadership)
        self._election: asyncio.Task[None] | None = None
        self._admin_servicer = AdminServicer(self)
        self._serving = asyncio.Event()  # set while this replica leads and has loaded state
        # /ui: pages gathered on this loop (set in on_ready), lag history sampled by the leader.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.address = settings.advertised
        self.lag_history = LagHistory()
        self._ui_data = UiData(self, self.lag_history)
        self._ui = UiRoutes(self, self._ui_data)

    # ---- Service protocol -----------------------------------------------------------------

    def grpc_services(self) -> Sequence[GrpcService]:
        return [
            GrpcService(
                "dataservice.assigner.v1.AssignerService",
                AssignerServicer(self),
                assigner_pb2_grpc.add_AssignerServiceServicer_to_server,
            ),
            GrpcService(
                "dataservice.assigner.v1.BindingService",
                BindingServicer(self),
                binding_pb2_grpc.add_BindingServiceServicer_to_server,
            ),
            GrpcService(
                "dataservice.assigner.v1.AdminService",
                self._admin_servicer,
                admin_pb2_grpc.add_AdminServiceServicer_to_server,
            ),
        ]

    def dependencies(self) -> Sequence[Dependency]:
        return [self._probe]

    def http_routes(self) -> Mapping[str, Route]:
        return self._ui.routes()

    def instance_meta(self) -> Mapping[str, str]:
        return {}

    def grpc_interceptors(self) -> Sequence[LeaderGuard]:
        """Followers answer FAILED_PRECONDITION NOT_LEADER with ``ds-leader``."""
        return [self.leader_guard]

    async def on_ready(self, server: GrpcServer) -> None:
        """Campaign for leadership (Consul session lock); without Consul this replica is
        the only one and leads at once. Election calls become_leader / step_down."""
        address = f"{self.settings.advertised}:{server.port}"
        self.address = address
        self.loop = asyncio.get_running_loop()
        self.faults.start()
        if self.settings.consul:
            self.leadership = LeaderElector(
                ElectionSettings(consul=self.settings.consul, address=address),
                on_elected=self.become_leader,
                on_demoted=self.step_down,
            )
        else:
            # The only replica: lead before reporting SERVING (become_leader is idempotent).
            self.leadership = StaticLeadership(address, on_elected=self.become_leader)
            await self.become_leader()
        # Not in self._tasks: step_down cancels those, and the campaign must go on.
        self._election = asyncio.create_task(self.leadership.run(), name="leader-election")

    async def become_leader(self) -> None:
        """Rebuild from the state topic, then serve: groups, epochs, bindings. Leases are
        re-learnt from the sidecars re-attaching; until TTL + grace has passed nothing is
        granted, so taking over moves no partition."""
        if self.leading:
            return
        await asyncio.to_thread(self.state.ensure_topic)
        snapshot = await asyncio.to_thread(self.state.load)
        settle_until = (
            self.now() + self.settings.lease_ttl_seconds + self.settings.lease_grace_seconds
        )
        for record in snapshot.groups.values():
            try:
                partitions = await self._partitions(record.topics)
            except DsError as err:
                log.error("group from state not restored", group=record.name, error=err.message)
                continue
            self.groups[record.name] = GroupRuntime(
                record,
                partitions,
                self.settings,
                self.metrics,
                self.state,
                epochs=snapshot.epochs.get(record.name, {}),
                settle_until=settle_until,
                clients=snapshot.bindings.get(record.name, set()),
                faults=self.faults,
            )
            log.info(
                "group restored",
                group=record.name,
                partitions=len(partitions),
                epochs=len(snapshot.epochs.get(record.name, {})),
            )
        for seed in self.settings.groups:
            if seed.name in self.groups:
                if self.groups[seed.name].seed != seed:
                    log.warning(
                        "configured group differs from its durable state; the state "
                        "wins (change it with UpdateGroup)",
                        group=seed.name,
                    )
                continue
            try:
                await self.create_group(
                    seed.name,
                    seed.topics,
                    seed.mode,
                    seed.consumer_config,
                    balance_strategy=seed.balance_strategy,
                )
            except DsError as err:
                log.error("configured group not created", group=seed.name, error=err.message)
        self.leading = True
        self._serving.set()
        self.metrics.leader.set(1)
        if self.settings.consul:  # elected among replicas: a takeover, resolved once settled
            report_failover(self.faults, self.leadership.leader_address, settle_until - self.now())
        self._tasks.append(asyncio.create_task(self._tick_loop(), name="tick"))
        self._tasks.append(asyncio.create_task(self._metadata_loop(), name="metadata"))
        sampler = LagSampler(self, self.lag_history)
        self._tasks.append(asyncio.create_task(sampler.run(), name="lag-sample"))

    async def step_down(self) -> None:
        """Leadership lost (or shutting down): stop acting on any group at once."""
        self.leading = False
        self._serving.clear()
        self.metrics.leader.set(0)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for group in self.groups.values():
            group.close()
            self.metrics.forget_group(group.name)
        self.groups.clear()
        self.lag_history.retain(set())

    async def drain(self) -> None:
        await self.leadership.resign()  # release the lock: a standby takes over at once
        await self.step_down()

    async def close(self) -> None:
        if self._election is not None:
            self._election.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._election
        await self.step_down()
        await self._ui_data.close()
        await asyncio.to_thread(self._admin_servicer.close)
        await asyncio.to_thread(self.state.close)
        await asyncio.to_thread(self.faults.close)

    # ---- state ------------------------------------------------------------------------

    @property
    def kafka_admin(self) -> AdminClient:
        """The process's one AdminClient (metadata, state topic, probe)."""
        return self._admin

    @property
    def offsets(self) -> OffsetsView:
        """The offsets reader DescribeGroup uses (shared cache: /ui shows the same figures)."""
        return self._admin_servicer.offsets

    @staticmethod
    def now() -> float:
        return time.monotonic()

    async def serving_group(self, name: str, wait: float = 5.0) -> GroupRuntime:
        """Like :meth:`group`, but a call that reaches a just-elected leader while it is
        still loading its state waits for it (bounded) instead of bouncing to backoff."""
        if not self.leading and self.leadership.is_leader:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._serving.wait(), wait)
        return self.group(name)

    def group(self, name: str) -> GroupRuntime:
        if not self.leading:
            raise DsError(Reason.SERVICE_NOT_READY, "the assigner is not serving groups yet")
        if not name:
            raise DsError(
                Reason.INVALID_FIELD, "group: must not be empty", metadata={"field": "group"}
            )
        group = self.groups.get(name)
        if group is None:
            raise DsError(
                Reason.GROUP_NOT_FOUND, f"group {name!r} does not exist", metadata={"group": name}
            )
        return group

    async def create_group(
        self,
        name: str,
        topics: list[str],
        mode: str,
        consumer_config: Mapping[str, str],
        *,
        balance_strategy: str = "count",
    ) -> GroupRuntime:
        record = GroupRecord(
            name=name,
            topics=list(topics),
            mode=mode,
            consumer_config=dict(consumer_config),
            balance_strategy=balance_strategy,
        )
        existing = self.groups.get(name)
        if existing is not None:
            old = existing.record
            same = (old.topics, old.mode, old.consumer_config, old.balance_strategy)
            if same == (
                record.topics,
                record.mode,
                record.consumer_config,
                record.balance_strategy,
            ):
                return existing  # idempotent: the same request again
            raise DsError(
                Reason.GROUP_ALREADY_EXISTS,
                f"group {name!r} exists with other settings",
                metadata={"group": name},
            )
        partitions = await self._partitions(topics)
        try:
            await self.state.put_group(record)
        except Exception as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, f"group not stored: {exc}") from exc
        group = GroupRuntime(
            record, partitions, self.settings, self.metrics, self.state, faults=self.faults
        )
        self.groups[name] = group
        log.info("group created", group=name, topics=topics, partitions=len(partitions))
        return group

    async def kafka_group_members(self, name: str) -> int:
        """Members of the Kafka consumer group ``name`` (classic subscribe() consumers)."""

        def describe() -> int:
            futures = self._admin.describe_consumer_groups([name], request_timeout=10)
            return len(futures[name].result(timeout=10).members)

        try:
            return await asyncio.to_thread(describe)
        except KafkaException as exc:
            raise DsError(
                Reason.KAFKA_UNAVAILABLE, f"cannot describe group {name!r}: {exc}"
            ) from exc

    async def update_group(self, record: GroupRecord) -> GroupRuntime:
        """Apply a new configuration to a group (UpdateGroup): durable first, then live.
        New topics' partitions are added; sidecars get consumer config changes pushed."""
        group = self.group(record.name)
        partitions = await self._partitions(record.topics)
        removed = set(group.record.topics) - set(record.topics)
        if removed:
            raise DsError(
                Reason.INVALID_FIELD,
                f"topics: removing topics from a group is not supported ({sorted(removed)})",
                metadata={"field": "group.topics"},
            )
        try:
            await self.state.put_group(record)
        except Exception as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, f"group not stored: {exc}") from exc
        group.update(record)
        group.set_partitions(partitions, self.now())
        return group

    async def _partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        try:
            metadata = await asyncio.to_thread(self._admin.list_topics, timeout=5)
        except KafkaException as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, f"cannot read Kafka metadata: {exc}") from exc
        result: list[TopicPartition] = []
        for topic in topics:
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                raise DsError(
                    Reason.TOPIC_NOT_FOUND,
                    f"topic {topic!r} does not exist",
                    metadata={"topic": topic},
                )
            result.extend(TopicPartition(topic, p) for p in sorted(info.partitions))
        return result

    async def _tick_loop(self) -> None:
        while True:
            now = self.now()
            for group in list(self.groups.values()):
                try:
                    group.tick(now)
                except Exception:
                    log.exception("tick failed", group=group.name)
            await asyncio.sleep(self.settings.tick_seconds)

    async def _metadata_loop(self) -> None:
        """Partitions added to a topic are picked up without a restart."""
        while True:
            await asyncio.sleep(self.settings.metadata_refresh_seconds)
            for group in list(self.groups.values()):
                try:
                    partitions = await self._partitions(group.seed.topics)
                except DsError as err:
                    log.warning("metadata refresh failed", group=group.name, error=err.message)
                    continue
                group.set_partitions(partitions, self.now())
