"""Assigner wiring and lifecycle: builds the narrow objects the servicers and pages use,
and runs leadership (load state, serve, timers; step down)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector

from dataservice.assigner.v1 import admin_pb2_grpc, assigner_pb2_grpc, binding_pb2_grpc
from services.assigner.admission import AdmissionPolicy, JoinAdmission, RecentLag
from services.assigner.commit_log import CommitLog
from services.assigner.external_resets import ExternalResets
from services.assigner.fault_emitters import report_failover
from services.assigner.kafka_cluster import KafkaCluster
from services.assigner.kafka_offsets import KafkaOffsets
from services.assigner.kafka_reset import KafkaResets
from services.assigner.leader_guard import LeaderGuard
from services.assigner.leadership import (
    ElectionSettings,
    LeaderElector,
    Replica,
    StaticLeadership,
    term_check_budget,
)
from services.assigner.metrics import AssignerMetrics
from services.assigner.offsets_view import OffsetsView
from services.assigner.registry import GroupRegistry
from services.assigner.resets import OffsetResets
from services.assigner.rpc import AdminServicer, AssignerServicer, BindingServicer
from services.assigner.settings import AssignerSettings
from services.assigner.state import StateStore
from services.assigner.ui.gather import LagSampler, UiData, UiSources
from services.assigner.ui.history import LagHistory
from services.assigner.ui.routes import UiRoutes
from services.runtime.grpcserver import GrpcServer, GrpcService
from services.runtime.http import Route
from services.runtime.kafka import KafkaProbe, new_admin
from services.runtime.lifecycle import Dependency
from services.runtime.reporter import reporter_for
from services.runtime.tasks import TaskSet
from services.runtime.tick_wake import next_tick

log = structlog.get_logger(__name__)


class AssignerApp:
    name = "ds-assigner"

    def __init__(self, settings: AssignerSettings) -> None:
        # How late the event loop runs (the tick loop's oversleep): joins wait while it is
        # late, so heartbeats come first (admission.py guarantee 5).
        self.loop_lag = RecentLag()
        self.settings = settings
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.metrics = AssignerMetrics(self.registry)
        self.faults = reporter_for(settings, "assigner", settings.advertised, self.registry)
        self._admin = new_admin(settings, client_id="ds-assigner")
        self._probe = KafkaProbe(settings, client_id="ds-assigner", admin=self._admin)
        self._tasks: list[asyncio.Task[None]] = []
        self.state = StateStore(
            settings,
            topic=settings.state_topic,
            admin=self._admin,
            epoch_write_timeout=settings.state_write_timeout_seconds,
            transactional_id=settings.state_transactional_id,
            on_lost=self._state_term_lost,
        )
        self.cluster = KafkaCluster(self._admin)
        # Address and leadership are replaced in on_ready, once the bound port is known.
        self.replica = Replica(settings.advertised)
        self.leader_guard = LeaderGuard(lambda: self.replica.leadership)
        self._election: asyncio.Task[None] | None = None
        self._fenced_tasks = TaskSet("state-fenced step-down failed")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.groups = GroupRegistry(
            settings,
            self.metrics,
            self.state,
            self.cluster,
            is_leader=lambda: self.replica.is_leader,
            faults=self.faults,
            clock=self.now,
        )
        # One offsets view (and its cache) for DescribeGroup, ListGroups and /ui.
        self.offsets = OffsetsView(KafkaOffsets(settings))
        # Offset resets read fresh offsets (never the view's cache) and commit.
        self._reset_offsets = KafkaOffsets(settings)
        self.resets = OffsetResets(
            KafkaResets(settings, self._reset_offsets), self.cluster, clock=self.now
        )
        # Offset resets made with Kafka's tools, followed (issue 23): reported by the
        # holders, and read from the commit log for those overwritten before they saw them.
        self.external = ExternalResets(self.resets, self.groups.get, clock=self.now)
        self.commit_log = CommitLog(
            settings, lambda name: self.groups.get(name) is not None, self.external.observe
        )
        # /ui: pages gathered on this loop (set in on_ready), lag history sampled by the leader.
        self.lag_history = LagHistory()
        self._ui_data = UiData(
            UiSources(
                groups=self.groups,
                offsets=self.offsets,
                cluster=self.cluster,
                replica=self.replica,
                settings=settings,
                service=self.name,
                clock=self.now,
            ),
            self.lag_history,
        )
        self._ui = UiRoutes(self._ui_data)

    # ---- Service protocol -----------------------------------------------------------------

    def grpc_services(self) -> Sequence[GrpcService]:
        return [
            GrpcService(
                "dataservice.assigner.v1.AssignerService",
                AssignerServicer(
                    self.groups,
                    self.metrics,
                    clock=self.now,
                    external=self.external,
                    admission=JoinAdmission(
                        AdmissionPolicy(
                            rate=self.settings.join_rate,
                            burst=self.settings.join_burst,
                            max_retry_after=self.settings.join_max_retry_after_seconds,
                            max_lag=self.settings.join_max_loop_lag_seconds,
                        ),
                        self.now(),
                    ),
                    lag=lambda: self.loop_lag.value(self.now()),
                ),
                assigner_pb2_grpc.add_AssignerServiceServicer_to_server,
            ),
            GrpcService(
                "dataservice.assigner.v1.BindingService",
                BindingServicer(self.groups),
                binding_pb2_grpc.add_BindingServiceServicer_to_server,
            ),
            GrpcService(
                "dataservice.assigner.v1.AdminService",
                AdminServicer(
                    self.groups,
                    self.offsets,
                    self.cluster,
                    self.settings,
                    clock=self.now,
                    resets=self.resets,
                ),
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
        self.replica.address = address
        self._ui.loop = self._loop = asyncio.get_running_loop()
        self.faults.start()
        if self.settings.consul:
            self.replica.leadership = LeaderElector(
                ElectionSettings(
                    consul=self.settings.consul,
                    address=address,
                    term_check_budget_seconds=term_check_budget(
                        self.settings.lease_ttl_seconds,
                        self.settings.lease_grace_seconds,
                        ElectionSettings.term_check_seconds,
                    ),
                ),
                on_elected=self.become_leader,
                on_demoted=self.step_down,
                confirm_term=self._confirm_term,
            )
        else:
            # The only replica: lead before reporting SERVING (become_leader is idempotent).
            self.replica.leadership = StaticLeadership(
                address, on_elected=self.become_leader, on_demoted=self.step_down
            )
            await self.become_leader()
        # Not in self._tasks: step_down cancels those, and the campaign must go on.
        self._election = asyncio.create_task(self.replica.leadership.run(), name="leader-election")

    async def become_leader(self) -> None:
        """Rebuild from the state topic, then serve: groups, epochs, bindings. Leases are
        re-learnt from the sidecars re-attaching; until TTL + grace has passed nothing is
        granted, so taking over moves no partition."""
        if self.groups.serving:
            return
        await asyncio.to_thread(self.state.ensure_topic)
        # Fence every earlier leader's state writes before reading: what load() reads is
        # then final, and no write of theirs lands after it.
        await asyncio.to_thread(self.state.begin_term)
        snapshot = await asyncio.to_thread(self.state.load)
        for kind, count in snapshot.bad_records.items():
            self.metrics.state_bad_records.labels(kind).inc(count)
        # Each group settles for its own TTL + grace (registry.restore); the report waits
        # for the last.
        settle_until = await self.groups.restore(snapshot, self.now())
        await self.groups.seed(self.settings.groups)
        self.groups.start_serving()
        self.metrics.leader.set(1)
        if self.settings.consul:  # elected among replicas: a takeover, resolved once settled
            report_failover(self.faults, self.replica.leader_address, settle_until - self.now())
        self._tasks.append(asyncio.create_task(self._tick_loop(), name="tick"))
        self._tasks.append(asyncio.create_task(self._metadata_loop(), name="metadata"))
        sampler = LagSampler(self.groups, self.offsets, self.lag_history, clock=self.now)
        self._tasks.append(asyncio.create_task(sampler.run(), name="lag-sample"))
        self._tasks.append(asyncio.create_task(self.commit_log.run(), name="commit-log"))

    async def step_down(self) -> None:
        """Leadership lost (or shutting down): stop acting on any group at once."""
        self.groups.stop_serving()
        await asyncio.to_thread(self.state.end_term)
        self.metrics.leader.set(0)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.groups.clear()
        self.lag_history.retain(set())

    async def _confirm_term(self) -> None:
        await self.state.confirm_term(self.replica.address, timeout=2.0)

    def _state_term_lost(self) -> None:
        """The state writer's thread: this replica's state writes were fenced (a newer
        leader took the state topic) or cannot go on. Step down at once, on the loop."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(lambda: self._spawn_fenced(self.replica.leadership.fenced()))

    def _spawn_fenced(self, step: Coroutine[Any, Any, None]) -> None:
        self._fenced_tasks.spawn(step, name="state-fenced")

    async def drain(self) -> None:
        await self.replica.leadership.resign()  # release the lock: a standby takes over at once
        await self.step_down()

    async def close(self) -> None:
        if self._election is not None:
            self._election.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._election
        await self.step_down()
        await self._ui_data.close()
        await asyncio.to_thread(self.offsets.close)
        await asyncio.to_thread(self._reset_offsets.close)
        await asyncio.to_thread(self.state.close)
        await asyncio.to_thread(self.faults.close)

    # ---- timers -----------------------------------------------------------------------

    @staticmethod
    def now() -> float:
        return time.monotonic()

    async def _tick_loop(self) -> None:
        """At each group's next deadline or when an input pokes (tick_wake.py), at most
        every tick_seconds; each sleep's overshoot is the loop lag the join admission reads."""
        gap = self.settings.tick_seconds
        while True:
            ticked = self.now()
            due = self.groups.tick()
            lag = await self.groups.wake.sleep(ticked, next_tick(ticked, due, gap), gap)
            self.loop_lag.record(self.now(), lag)

    async def _metadata_loop(self) -> None:
        """Partitions added to a topic are picked up without a restart."""
        while True:
            await asyncio.sleep(self.settings.metadata_refresh_seconds)
            await self.groups.refresh_partitions()
