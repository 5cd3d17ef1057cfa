"""gRPC servicers of the assigner: thin adapters over :class:`AssignerApp` state."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

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
from dataservice.common.v1 import common_pb2
from services.runtime.errors import DsError, Reason, invalid, not_implemented

if TYPE_CHECKING:
    from services.assigner.app import AssignerApp
    from services.assigner.groups import GroupRuntime

log = structlog.get_logger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]
_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,255}$")


def require_id(field: str, value: str) -> str:
    if not value:
        raise invalid(field, "must not be empty")
    if not _ID.match(value):
        raise invalid(field, "may only hold letters, digits and . _ : @ - (at most 255)")
    return value


class AssignerServicer(assigner_pb2_grpc.AssignerServiceServicer):
    def __init__(self, app: AssignerApp) -> None:
        self.app = app

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
        group = self.app.group(join.group)
        conn = group.attach(join, self.app.now())
        self.app.metrics.sessions.inc()
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
            self.app.metrics.sessions.dec()

    async def _read(
        self,
        group: GroupRuntime,
        conn: Any,
        request_iterator: AsyncIterator[assigner_pb2.SessionRequest],
    ) -> None:
        try:
            async for request in request_iterator:
                if request.WhichOneof("kind") == "heartbeat":
                    group.heartbeat(conn, request.heartbeat, self.app.now())
                else:
                    log.warning("ignoring a second join on an open session", sidecar=conn.member_id)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            # Stream ended (sidecar stopped or network broke): end our side too.
            conn.close()

    async def Leave(
        self, request: assigner_pb2.LeaveRequest, context: Context
    ) -> assigner_pb2.LeaveResponse:
        require_id("sidecar_id", request.sidecar_id)
        group = self.app.group(request.group)
        if request.sidecar_id not in group.coordinator.members:
            raise DsError(
                Reason.SIDECAR_NOT_FOUND,
                f"sidecar {request.sidecar_id!r} is not a member of group {request.group!r}",
                metadata={"group": request.group, "sidecar_id": request.sidecar_id},
            )
        group.leave(request.sidecar_id, self.app.now())
        return assigner_pb2.LeaveResponse()


class BindingServicer(binding_pb2_grpc.BindingServiceServicer):
    def __init__(self, app: AssignerApp) -> None:
        self.app = app

    async def Bind(
        self, request: binding_pb2.BindRequest, context: Context
    ) -> binding_pb2.BindResponse:
        require_id("client_id", request.client_id)
        group = self.app.group(request.group)
        group.clients.add(request.client_id)
        self.app.metrics_bindings()
        return binding_pb2.BindResponse(binding=group.binding_for(request.client_id))

    async def WatchBinding(
        self, request: binding_pb2.WatchBindingRequest, context: Context
    ) -> AsyncIterator[binding_pb2.WatchBindingResponse]:
        require_id("client_id", request.client_id)
        group = self.app.group(request.group)
        queue: asyncio.Queue[types_pb2.Binding] = asyncio.Queue()
        group.watchers.add(queue)
        try:
            if request.known_version != group.binding_version:
                yield binding_pb2.WatchBindingResponse(binding=group.binding_for(request.client_id))
            while True:
                binding = await queue.get()
                binding.client_id = request.client_id
                yield binding_pb2.WatchBindingResponse(binding=binding)
        finally:
            group.watchers.discard(queue)

    async def Unbind(
        self, request: binding_pb2.UnbindRequest, context: Context
    ) -> binding_pb2.UnbindResponse:
        require_id("client_id", request.client_id)
        group = self.app.group(request.group)
        group.clients.discard(request.client_id)
        self.app.metrics_bindings()
        return binding_pb2.UnbindResponse()


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """ListGroups, DescribeGroup and CreateGroup; the other RPCs answer UNIMPLEMENTED."""

    def __init__(self, app: AssignerApp) -> None:
        self.app = app

    async def ListGroups(
        self, request: admin_pb2.ListGroupsRequest, context: Context
    ) -> admin_pb2.ListGroupsResponse:
        return admin_pb2.ListGroupsResponse(
            groups=[
                admin_pb2.GroupSummary(
                    config=g.config_proto(),
                    member_count=len(g.coordinator.live_members()),
                    partition_count=len(g.coordinator.leases),
                )
                for g in sorted(self.app.groups.values(), key=lambda g: g.name)
            ]
        )

    async def DescribeGroup(
        self, request: admin_pb2.DescribeGroupRequest, context: Context
    ) -> admin_pb2.DescribeGroupResponse:
        group = self.app.group(request.group)
        states = {
            "free": types_pb2.LEASE_STATE_UNASSIGNED,
            "granted": types_pb2.LEASE_STATE_GRANTED,
            "revoking": types_pb2.LEASE_STATE_REVOKING,
        }
        return admin_pb2.DescribeGroupResponse(
            config=group.config_proto(),
            members=[
                types_pb2.Member(
                    sidecar_id=m.id,
                    endpoint=m.endpoint,
                    zone=m.zone or "",
                    capacity=m.capacity or 0,
                )
                for m in group.coordinator.live_members()
            ],
            leases=[
                types_pb2.Lease(
                    topic=lease.tp.topic,
                    partition=lease.tp.partition,
                    holder=lease.holder or "",
                    epoch=lease.epoch,
                    state=states[lease.state.value],
                )
                for _, lease in sorted(group.coordinator.leases.items())
            ],
            bindings=[group.binding_for(c) for c in sorted(group.clients)],
        )

    async def CreateGroup(
        self, request: admin_pb2.CreateGroupRequest, context: Context
    ) -> admin_pb2.CreateGroupResponse:
        cfg = request.group
        require_id("group.name", cfg.name)
        if not cfg.topics:
            raise invalid("group.topics", "name at least one topic")
        mode = {
            common_pb2.GROUP_MODE_UNSPECIFIED: "leased",
            common_pb2.GROUP_MODE_LEASED: "leased",
            common_pb2.GROUP_MODE_KAFKA_GROUP: "kafka_group",
        }[cfg.mode]
        group = await self.app.create_group(
            cfg.name, list(cfg.topics), mode, dict(cfg.consumer_config)
        )
        return admin_pb2.CreateGroupResponse(group=group.config_proto())

    async def UpdateGroup(
        self, request: admin_pb2.UpdateGroupRequest, context: Context
    ) -> admin_pb2.UpdateGroupResponse:
        await not_implemented(context, "AdminService.UpdateGroup")

    async def ResetOffsets(
        self, request: admin_pb2.ResetOffsetsRequest, context: Context
    ) -> admin_pb2.ResetOffsetsResponse:
        await not_implemented(context, "AdminService.ResetOffsets")

    async def MoveLease(
        self, request: admin_pb2.MoveLeaseRequest, context: Context
    ) -> admin_pb2.MoveLeaseResponse:
        await not_implemented(context, "AdminService.MoveLease")
