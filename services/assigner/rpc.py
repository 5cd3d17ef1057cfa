"""gRPC servicers of the assigner: thin adapters over the narrow objects they are given.

The groups come from :class:`~services.assigner.registry.GroupRegistry`, offsets from
:class:`~services.assigner.offsets_view.OffsetsView`, the time from a clock; none of them
knows the app, so each runs on an in-process server in the unit tests.

One job, why whole (about 660 lines): the assigner's three gRPC servicers (Assigner,
Binding, Admin) as thin adapters: request validation and translation only, the decisions in
the objects they are given. They share the validation helpers and the error mapping; the
admin API's own rules already live in admin/.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc.aio
import structlog

from dataservice.assigner.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    assigner_pb2,
    assigner_pb2_grpc,
    binding_pb2,
    binding_pb2_grpc,
    types_pb2,
)
from dsclient import local_socket
from dsclient.reasons import RETRY_AFTER_METADATA_KEY, DsError, Reason, invalid
from services.assigner.admin.idempotency import IdempotencyCache
from services.assigner.admin.librdkafka import check_librdkafka_properties
from services.assigner.admin.messages import client_message, lease_message, member_message
from services.assigner.admin.paging import PageTokens, page, page_size
from services.assigner.admin.records import make_record, record_fields
from services.assigner.admin.reset_request import reset_spec
from services.assigner.admin.update_mask import apply_update_mask, changed_paths, mask_paths
from services.assigner.admin.validation import (
    validate_commit_fencing_change,
    validate_group_config,
    validate_group_name,
    validate_request_id,
    version_conflict,
)
from services.assigner.admission import JoinAdmission
from services.assigner.bindings import DROPPED
from services.assigner.coordinator import LeaseState
from services.assigner.external_resets import ExternalResets
from services.assigner.fault_emitters import DeleteAudit
from services.assigner.group_timing import GroupTiming, check_live_change, effective_timing
from services.assigner.groups import GroupRuntime, duration
from services.assigner.kafka_cluster import GroupMembers
from services.assigner.kafka_offsets import KAFKA_TIMEOUT_SECONDS
from services.assigner.metrics import AssignerMetrics
from services.assigner.mode_switch import ModeSwitch
from services.assigner.offsets import lag_seconds, total_lag
from services.assigner.offsets_view import OffsetsView, budget
from services.assigner.registry import GroupRegistry
from services.assigner.resets import OffsetResets, ResetOrder, ResetResult
from services.assigner.settings import AssignerSettings
from services.assigner.state import GroupRecord
from services.runtime.auth import current_identity
from services.runtime.group_enums import COMMIT_FENCINGS
from services.runtime.topic_partition import TopicPartition

log = structlog.get_logger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]
_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,255}$")
Clock = Callable[[], float]
# Request metadata naming who asks for an admin change (dsctl sends user@host), for the
# audit records when authorization is off; the caller's address when absent. With
# authorization on, the authenticated identity is the actor and this names the person.
ACTOR_METADATA_KEY = "ds-actor"
MAX_ACTOR_LENGTH = 200


def require_id(field: str, value: str) -> str:
    if not value:
        raise invalid(field, "must not be empty")
    if not _ID.match(value):
        raise invalid(field, "may only hold letters, digits and . _ : @ - (at most 255)")
    return value


class AssignerServicer(assigner_pb2_grpc.AssignerServiceServicer):
    """The sidecars' Session and Leave (ARCHITECTURE §3.1)."""

    def __init__(
        self,
        groups: GroupRegistry,
        metrics: AssignerMetrics,
        clock: Clock = time.monotonic,
        *,
        external: ExternalResets | None = None,
        admission: JoinAdmission | None = None,
        lag: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.groups = groups
        self.metrics = metrics
        self.clock = clock
        self.external = external
        self.admission = admission  # None: every join is taken on
        self.lag = lag  # how late the event loop runs now (seconds)

    async def Session(
        self, request_iterator: AsyncIterator[assigner_pb2.SessionRequest], context: Context
    ) -> AsyncIterator[assigner_pb2.SessionResponse]:
        try:
            first = await anext(request_iterator)
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "join":
            raise DsError(Reason.SESSION_NOT_JOINED, "the first Session message must be a join")
        join = first.join
        require_id("join.sidecar_id", join.sidecar_id)
        if not join.endpoint:
            raise invalid("join.endpoint", "must be the sidecar's HOST:PORT")
        if join.capacity < 0:
            raise invalid("join.capacity", "must be >= 0 (0 = unlimited)")
        if join.local_endpoint and not local_socket.names_sidecar(
            join.local_endpoint, join.sidecar_id
        ):
            raise invalid(
                "join.local_endpoint", "must be unix:PATH whose file name carries the sidecar id"
            )
        self._admit(join)
        group = await self.groups.serving_group(join.group)
        # Authorization (when on) let this identity name this sidecar id; the group also
        # keeps another identity from taking over a live session of it.
        caller = current_identity()
        conn = group.attach(join, self.clock(), owner=caller.name if caller else None)
        self.metrics.sessions.inc()
        reader = asyncio.create_task(self._read(group, conn, request_iterator))
        try:
            while True:
                message = await conn.queue.get()
                if message is None:
                    break
                yield message
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            group.detach(conn)
            self.metrics.sessions.dec()

    def _admit(self, join: assigner_pb2.SessionJoin) -> None:
        """Refuse a join beyond the admission policy's capacity with a retry-after
        (JOIN_THROTTLED, UNAVAILABLE): before any of its work is done, so a storm of them
        costs the attached sidecars' heartbeats little. A join reporting held leases (a
        re-attach) always passes."""
        if self.admission is None:
            return
        verdict = self.admission.admit(
            self.clock(), reattach=len(join.held_leases) > 0, lag=self.lag()
        )
        if verdict.admitted:
            return
        self.metrics.joins_throttled.inc()
        raise DsError(
            Reason.JOIN_THROTTLED,
            f"the assigner is taking on joins as fast as it can; join again in "
            f"{verdict.retry_after:.2f}s",
            metadata={RETRY_AFTER_METADATA_KEY: str(math.ceil(verdict.retry_after * 1000))},
        )

    async def _read(
        self,
        group: GroupRuntime,
        conn: Any,
        request_iterator: AsyncIterator[assigner_pb2.SessionRequest],
    ) -> None:
        try:
            async for request in request_iterator:
                if request.WhichOneof("kind") == "heartbeat":
                    group.heartbeat(conn, request.heartbeat, self.clock())
                    if request.heartbeat.external_commits and self.external is not None:
                        self.external.report(
                            group, conn.member_id, request.heartbeat.external_commits
                        )
                else:
                    log.warning("ignoring a second join on an open session", sidecar=conn.member_id)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            # Stream ended (sidecar stopped or network broke): end our side too. Not closed
            # here yet means the sidecar's side ended it (a killed sidecar's kernel closes
            # its socket at once): the member is gone unless it attaches again soon.
            if not conn.closed:
                group.disconnected(conn, self.clock())
            conn.close()

    async def Leave(
        self, request: assigner_pb2.LeaveRequest, context: Context
    ) -> assigner_pb2.LeaveResponse:
        require_id("sidecar_id", request.sidecar_id)
        group = self.groups.group(request.group)
        caller = current_identity()
        group.check_owner(request.sidecar_id, caller.name if caller else None)
        if request.sidecar_id not in group.coordinator.members:
            raise DsError(
                Reason.SIDECAR_NOT_FOUND,
                f"sidecar {request.sidecar_id!r} is not a member of group {request.group!r}",
                metadata={"group": request.group, "sidecar_id": request.sidecar_id},
            )
        hold = 0.0
        if request.graceful:
            hold = group.leave(request.sidecar_id, self.clock())
        else:
            group.abandon(request.sidecar_id, self.clock())
        return assigner_pb2.LeaveResponse(hold_window=duration(hold))


class BindingServicer(binding_pb2_grpc.BindingServiceServicer):
    """The application clients' bindings to the sidecars serving their group."""

    def __init__(self, groups: GroupRegistry) -> None:
        self.groups = groups

    async def Bind(
        self, request: binding_pb2.BindRequest, context: Context
    ) -> binding_pb2.BindResponse:
        require_id("client_id", request.client_id)
        group = await self.groups.serving_group(request.group)
        group.bindings.bind(request.client_id)
        return binding_pb2.BindResponse(binding=group.bindings.binding_for(request.client_id))

    async def WatchBinding(
        self, request: binding_pb2.WatchBindingRequest, context: Context
    ) -> AsyncIterator[binding_pb2.WatchBindingResponse]:
        require_id("client_id", request.client_id)
        if request.known_version < 0:
            raise invalid("known_version", "may not be negative (0: I have no binding yet)")
        group = await self.groups.serving_group(request.group)
        queue = group.bindings.open_watch()
        group.bindings.watch_started(request.client_id)
        try:
            # 0 is "none yet" (binding.proto), even while the group's own version is 0.
            if request.known_version == 0 or request.known_version != group.bindings.version:
                yield binding_pb2.WatchBindingResponse(
                    binding=group.bindings.binding_for(request.client_id)
                )
            while True:
                binding = await queue.get()
                if binding.version == DROPPED:
                    # Too slow to read its bindings: watch again, with the known version.
                    raise DsError(
                        Reason.WATCHER_TOO_SLOW,
                        f"this watch fell {queue.maxsize} bindings behind and was dropped; "
                        "watch again",
                        metadata={"group": group.name, "limit": str(queue.maxsize)},
                    )
                if binding.version < 0:
                    # The group was closed here (leadership lost, shutting down): end the
                    # stream with a retryable status; the client re-watches the leader.
                    raise DsError(
                        Reason.SERVICE_NOT_READY, "this assigner stopped serving the group"
                    )
                own = types_pb2.Binding()
                own.CopyFrom(binding)  # the queued binding is shared by every watcher
                own.client_id = request.client_id
                yield binding_pb2.WatchBindingResponse(binding=own)
        finally:
            group.bindings.watch_ended(request.client_id)
            group.bindings.close_watch(queue)

    async def Unbind(
        self, request: binding_pb2.UnbindRequest, context: Context
    ) -> binding_pb2.UnbindResponse:
        require_id("client_id", request.client_id)
        group = self.groups.group(request.group)
        group.bindings.unbind(request.client_id)
        return binding_pb2.UnbindResponse()


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """The operators' API (ARCHITECTURE §5.5) over :mod:`services.assigner.admin`, the
    offset resets (:mod:`services.assigner.resets`) and the mode switch
    (:mod:`services.assigner.mode_switch`). Kafka is read in worker threads only.
    """

    def __init__(
        self,
        groups: GroupRegistry,
        offsets: OffsetsView,
        kafka: GroupMembers,
        settings: AssignerSettings,
        clock: Clock = time.monotonic,
        *,
        resets: OffsetResets,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.groups = groups
        self.offsets = offsets
        self.kafka = kafka
        self.settings = settings
        self.clock = clock
        self.resets = resets
        self.wall_ms = wall_ms
        self.switch = ModeSwitch(kafka, drain_timeout=settings.drain_timeout_seconds, clock=clock)
        self.requests = IdempotencyCache()
        self.page_tokens = PageTokens()
        # One configuration change at a time: the config_version check and the write it
        # guards must not interleave with another change across the awaits between them.
        self._writes = asyncio.Lock()

    # ---- reads --------------------------------------------------------------------------

    async def ListGroups(
        self, request: admin_pb2.ListGroupsRequest, context: Context
    ) -> admin_pb2.ListGroupsResponse:
        size = page_size(request.page_size)
        after = self.page_tokens.parse(request.page_token)
        every = {g.name: g for g in await self.groups.serving_groups()}
        names, last = page(sorted(every), after, size)
        groups = [every[n] for n in names]
        # Live, for this page only; Kafka not answering in time gives total_lag -1.
        offsets = await self.offsets.many(
            {g.name: sorted(g.coordinator.leases) for g in groups},
            budget(context.time_remaining(), KAFKA_TIMEOUT_SECONDS),
        )
        summaries = []
        for g in groups:
            read = offsets.get(g.name)
            total = -1 if read is None or isinstance(read, DsError) else total_lag(read)
            summaries.append(
                admin_pb2.GroupSummary(
                    config=g.config_proto(),
                    member_count=len(g.coordinator.live_members()),
                    partition_count=len(g.coordinator.leases),
                    total_lag=total,
                )
            )
        return admin_pb2.ListGroupsResponse(
            groups=summaries, next_page_token=self.page_tokens.issue(last) if last else ""
        )

    async def DescribeGroup(
        self, request: admin_pb2.DescribeGroupRequest, context: Context
    ) -> admin_pb2.DescribeGroupResponse:
        validate_group_name("group", request.group)
        group = self.groups.group(request.group)
        partitions = sorted(group.coordinator.leases)
        offsets = await self.offsets.group(
            group.name,
            partitions,
            budget(context.time_remaining(), KAFKA_TIMEOUT_SECONDS, share=0.6),
        )
        starts = {tp: max(o.committed, o.earliest) for tp, o in offsets.items() if o.lag > 0}
        oldest = await self.offsets.oldest_timestamps(
            starts, budget(context.time_remaining(), 1.0, share=0.3)
        )
        now_mono, now_wall = self.clock(), time.time()
        return admin_pb2.DescribeGroupResponse(
            config=group.config_proto(),
            members=[
                member_message(
                    m,
                    now_mono,
                    now_wall,
                    config=group.member_configs.get(m.id),
                    drained=m.id in group.coordinator.drained,
                )
                for m in group.coordinator.live_members()
            ],
            leases=[
                lease_message(group.coordinator.leases[tp], now_mono, now_wall) for tp in partitions
            ],
            partitions=[
                admin_pb2.PartitionLag(
                    topic=tp.topic,
                    partition=tp.partition,
                    committed_offset=o.committed,
                    end_offset=o.end,
                    lag_records=o.lag,
                    lag_seconds=lag_seconds(o.lag, oldest.get(tp), now_wall),
                    committed_by=o.committed_by,
                )
                for tp, o in sorted(offsets.items())
            ],
            bindings=[group.bindings.binding_for(c) for c in sorted(group.clients)],
        )

    # ---- changes ------------------------------------------------------------------------

    async def ListClients(
        self, request: admin_pb2.ListClientsRequest, context: Context
    ) -> admin_pb2.ListClientsResponse:
        if request.group:
            validate_group_name("group", request.group)
            groups = [self.groups.group(request.group)]
        else:
            groups = await self.groups.serving_groups()
        return admin_pb2.ListClientsResponse(
            clients=[client_message(row) for g in groups for row in g.client_rows()]
        )

    async def CreateGroup(
        self, request: admin_pb2.CreateGroupRequest, context: Context
    ) -> admin_pb2.CreateGroupResponse:
        cfg = request.group
        validate_group_config(cfg, *self._timing_defaults())
        validate_request_id(request.request_id)
        # Refuses settings the durable record cannot carry yet rather than dropping them.
        record = make_record(record_fields(cfg, self._timing()), self._record_defaults())
        await asyncio.to_thread(
            check_librdkafka_properties, "group.consumer_config", record.consumer_config
        )
        return await self.requests.run(
            "CreateGroup", request, request.request_id, lambda: self._create(record)
        )

    async def _create(self, record: GroupRecord) -> admin_pb2.CreateGroupResponse:
        async with self._writes:
            # The same settings again answer the existing group; other settings are
            # GROUP_ALREADY_EXISTS; a topic that does not exist is TOPIC_NOT_FOUND.
            group = await self.groups.create_group(record)
        return admin_pb2.CreateGroupResponse(group=group.config_proto())

    async def UpdateGroup(
        self, request: admin_pb2.UpdateGroupRequest, context: Context
    ) -> admin_pb2.UpdateGroupResponse:
        validate_group_name("group.name", request.group.name)
        validate_request_id(request.request_id)
        if request.expected_config_version < 0:
            raise invalid("expected_config_version", "must be >= 0 (0 = unconditional)")
        paths = mask_paths(request.update_mask if request.HasField("update_mask") else None)
        self.groups.group(request.group.name)  # NOT_FOUND before anything else
        return await self.requests.run(
            "UpdateGroup", request, request.request_id, lambda: self._update(request, paths)
        )

    async def _update(
        self, request: admin_pb2.UpdateGroupRequest, paths: tuple[str, ...]
    ) -> admin_pb2.UpdateGroupResponse:
        async with self._writes:
            group = self.groups.group(request.group.name)
            current = group.config_proto()
            expected = request.expected_config_version
            if expected and expected != current.config_version:
                raise version_conflict(group.name, expected, current.config_version)
            desired = apply_update_mask(current, request.group, paths)
            validate_group_config(desired, *self._timing_defaults())
            validate_commit_fencing_change(
                COMMIT_FENCINGS[current.commit_fencing], COMMIT_FENCINGS[desired.commit_fencing]
            )
            changed = changed_paths(current, desired)
            if not changed:
                return admin_pb2.UpdateGroupResponse(group=current)  # nothing to apply
            group.check_idle()  # OPERATION_IN_PROGRESS while a reset or switch runs
            record = make_record(record_fields(desired, self._timing()), self._record_defaults())
            check_live_change(
                group.timing,
                effective_timing(
                    record.lease_ttl_seconds, record.heartbeat_interval_seconds, self._timing()
                ),
                group.commit_fencing,
            )
            record.config_version = current.config_version + 1
            if "consumer_config" in changed:
                await asyncio.to_thread(
                    check_librdkafka_properties,
                    "group.consumer_config",
                    record.consumer_config,
                )
            if "mode" in changed:
                # With its sidecars attached and clients bound; returns once switched.
                await self.groups.topics.partitions(record.topics)  # TOPIC_NOT_FOUND first
                await self.switch.switch(group, record, self.groups.update_group)
            else:
                # Durable first, then live (sidecars get consumer config pushed); a topic
                # that does not exist is TOPIC_NOT_FOUND.
                group = await self.groups.update_group(record)
            log.info("group updated", group=group.name, changed=changed)
            return admin_pb2.UpdateGroupResponse(group=group.config_proto())

    async def DeleteGroup(
        self, request: admin_pb2.DeleteGroupRequest, context: Context
    ) -> admin_pb2.DeleteGroupResponse:
        validate_group_name("group", request.group)
        validate_request_id(request.request_id)
        actor = _actor(context)
        return await self.requests.run(
            "DeleteGroup", request, request.request_id, lambda: self._delete(request, actor)
        )

    async def _delete(
        self, request: admin_pb2.DeleteGroupRequest, actor: str
    ) -> admin_pb2.DeleteGroupResponse:
        async with self._writes:
            # NOT_FOUND, GROUP_HAS_CLIENTS (unless forced), OPERATION_IN_PROGRESS first;
            # durable (tombstones) before the group goes from the live registry.
            group, clients = await self.groups.delete_group(request.group, force=request.force)
        self.offsets.forget(group.name)
        config = group.config_proto()
        group.faults.deleted(
            DeleteAudit(
                delete_id=str(uuid.uuid4()),
                actor=actor,
                forced=request.force,
                clients=tuple(clients),
                config_version=config.config_version,
                request_id=request.request_id,
            )
        )
        log.warning(
            "group deleted", group=group.name, actor=actor, forced=request.force, clients=clients
        )
        return admin_pb2.DeleteGroupResponse(group=config, unbound_clients=clients)

    async def ResetOffsets(
        self, request: admin_pb2.ResetOffsetsRequest, context: Context
    ) -> admin_pb2.ResetOffsetsResponse:
        validate_group_name("group", request.group)
        validate_request_id(request.request_id)
        group = self.groups.group(request.group)
        spec = reset_spec(
            request, group.record.topics, sorted(group.coordinator.leases), self.wall_ms()
        )
        if request.dry_run:
            return _reset_response(await self.resets.preview(group, spec), dry_run=True)
        order = ResetOrder(
            spec, source="admin", actor=_actor(context), request_id=request.request_id
        )
        return await self.requests.run(
            "ResetOffsets", request, request.request_id, lambda: self._reset(group, order)
        )

    async def _reset(
        self, group: GroupRuntime, order: ResetOrder
    ) -> admin_pb2.ResetOffsetsResponse:
        try:
            result = await self.resets.reset(group, order)
        finally:
            self.offsets.forget(group.name)
        return _reset_response(result, dry_run=False)

    async def MoveLease(
        self, request: admin_pb2.MoveLeaseRequest, context: Context
    ) -> admin_pb2.MoveLeaseResponse:
        validate_group_name("group", request.group)
        if not request.topic:
            raise invalid("topic", "must not be empty")
        if request.partition < 0:
            raise invalid("partition", "must be >= 0")
        require_id("target_sidecar_id", request.target_sidecar_id)
        validate_request_id(request.request_id)
        return await self.requests.run(
            "MoveLease", request, request.request_id, lambda: self._move(request)
        )

    async def _move(self, request: admin_pb2.MoveLeaseRequest) -> admin_pb2.MoveLeaseResponse:
        """Starts the handoff and answers at once with the lease as it is then: REVOKING
        (holder = the current holder) while the holder drains, or GRANTED to the target when
        the partition was free or the target already holds it. DescribeGroup shows the
        target with a higher epoch once the holder has released."""
        group = self.groups.group(request.group)
        if group.record.mode != "leased":
            raise DsError(
                Reason.GROUP_MODE_MISMATCH,
                f"group {group.name!r} is in {group.record.mode} mode: Kafka assigns its "
                "partitions",
                metadata={"group": group.name, "mode": group.record.mode},
            )
        tp = TopicPartition(request.topic, request.partition)
        lease = group.coordinator.leases.get(tp)
        if lease is not None and tp in group.coordinator.paused:
            raise DsError(
                Reason.OPERATION_IN_PROGRESS,
                f"{tp.topic}/{tp.partition} of group {group.name!r} is paused for an offset "
                "reset; move it once the reset is done",
                metadata={"group": group.name, "operation": "an offset reset"},
            )
        if lease is None:
            raise DsError(
                Reason.TOPIC_NOT_FOUND,
                f"{request.topic}/{request.partition} is not a partition of group {group.name!r}",
                metadata={
                    "group": group.name,
                    "topic": request.topic,
                    "partition": str(request.partition),
                },
            )
        target = request.target_sidecar_id
        if target not in {m.id for m in group.coordinator.live_members()}:
            raise DsError(
                Reason.SIDECAR_NOT_FOUND,
                f"sidecar {target!r} is not a live member of group {group.name!r}",
                metadata={"group": group.name, "sidecar_id": target},
            )
        if not (lease.holder == target and lease.state is LeaseState.GRANTED):
            group.move_lease(tp, target, self.clock())  # no-op when already heading there
        return admin_pb2.MoveLeaseResponse(lease=lease_message(lease, self.clock(), time.time()))

    async def DrainSidecar(
        self, request: admin_pb2.DrainSidecarRequest, context: Context
    ) -> admin_pb2.DrainSidecarResponse:
        validate_group_name("group", request.group)
        require_id("sidecar_id", request.sidecar_id)
        validate_request_id(request.request_id)
        return await self.requests.run(
            "DrainSidecar", request, request.request_id, lambda: self._drain(request)
        )

    async def _drain(
        self, request: admin_pb2.DrainSidecarRequest
    ) -> admin_pb2.DrainSidecarResponse:
        group = self.groups.group(request.group)
        if group.record.mode != "leased":
            raise DsError(
                Reason.GROUP_MODE_MISMATCH,
                f"group {group.name!r} is in {group.record.mode} mode: Kafka assigns its "
                "partitions (stop the sidecar instead)",
                metadata={"group": group.name, "mode": group.record.mode},
            )
        member = next(
            (m for m in group.coordinator.live_members() if m.id == request.sidecar_id), None
        )
        if member is None:
            raise _sidecar_not_found(group.name, request.sidecar_id)
        await self._set_drained(group, request.sidecar_id, drained=True)
        now_mono, now_wall = self.clock(), time.time()
        return admin_pb2.DrainSidecarResponse(
            member=member_message(member, now_mono, now_wall, drained=True),
            leases=[
                lease_message(lease, now_mono, now_wall)
                for lease in group.coordinator.held_by(request.sidecar_id)
            ],
        )

    async def UndrainSidecar(
        self, request: admin_pb2.UndrainSidecarRequest, context: Context
    ) -> admin_pb2.UndrainSidecarResponse:
        validate_group_name("group", request.group)
        require_id("sidecar_id", request.sidecar_id)
        validate_request_id(request.request_id)
        return await self.requests.run(
            "UndrainSidecar", request, request.request_id, lambda: self._undrain(request)
        )

    async def _undrain(
        self, request: admin_pb2.UndrainSidecarRequest
    ) -> admin_pb2.UndrainSidecarResponse:
        group = self.groups.group(request.group)
        sidecar = request.sidecar_id
        live = {m.id: m for m in group.coordinator.live_members()}
        if sidecar not in live and sidecar not in group.coordinator.drained:
            raise _sidecar_not_found(group.name, sidecar)
        await self._set_drained(group, sidecar, drained=False)
        response = admin_pb2.UndrainSidecarResponse()
        if sidecar in live:
            response.member.CopyFrom(member_message(live[sidecar], self.clock(), time.time()))
        return response

    async def _set_drained(self, group: GroupRuntime, sidecar: str, *, drained: bool) -> None:
        try:
            await group.set_drained(sidecar, drained, self.clock())
        except Exception as exc:
            raise DsError(
                Reason.KAFKA_UNAVAILABLE, f"the drain was not stored (nothing changed): {exc}"
            ) from exc

    # ---- helpers ------------------------------------------------------------------------

    def _timing_defaults(self) -> tuple[float, float]:
        return self.settings.lease_ttl_seconds, self.settings.heartbeat_interval_seconds

    def _timing(self) -> GroupTiming:
        """The assigner's lease TTL and heartbeat interval: a group's unless it chose its
        own (kafka-fenced groups only, services/assigner/group_timing.py)."""
        return GroupTiming(*self._timing_defaults())

    def _record_defaults(self) -> dict[str, Any]:
        """What a GroupConfig field means when the record cannot carry it."""
        return {"balance_strategy": "count"}


def _sidecar_not_found(group: str, sidecar: str) -> DsError:
    return DsError(
        Reason.SIDECAR_NOT_FOUND,
        f"sidecar {sidecar!r} is not a live member of group {group!r}",
        metadata={"group": group, "sidecar_id": sidecar},
    )


def _actor(context: Context) -> str:
    """Who asks, for the audit record: the authenticated identity (with what it says of
    itself in ``ds-actor``), else ``ds-actor``, else the caller's address."""
    said = ""
    for key, value in context.invocation_metadata() or ():
        if key == ACTOR_METADATA_KEY and value:
            said = value if isinstance(value, str) else value.decode(errors="replace")
    identity = current_identity()
    if identity is not None:
        who = f"{identity.name} ({said})" if said else identity.name
    else:
        who = said or str(context.peer() or "")
    return who[:MAX_ACTOR_LENGTH]


def _reset_response(result: ResetResult, *, dry_run: bool) -> admin_pb2.ResetOffsetsResponse:
    return admin_pb2.ResetOffsetsResponse(
        partitions=[
            admin_pb2.PartitionReset(
                topic=r.tp.topic,
                partition=r.tp.partition,
                old_offset=r.old,
                new_offset=r.new,
                applied=result.applied,
                clamped=r.clamped,
                target_offset=r.target,
                epoch=result.epochs.get(r.tp, 0),
            )
            for r in result.partitions
        ],
        dry_run=dry_run,
    )
