"""Group state as the admin API's messages (pure): leases, members, and this process's
monotonic instants as wall-clock timestamps."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from dataservice.assigner.v1 import admin_pb2, types_pb2
from services.assigner.client_activity import ClientRow
from services.assigner.coordinator import Lease, LeaseState, MemberInfo
from services.assigner.groups import MemberConfig


def wall_timestamp(mono: float, now_mono: float, now_wall: float) -> timestamp_pb2.Timestamp:
    """A monotonic instant of this process as wall-clock time."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int((now_wall - (now_mono - mono)) * 1e9))
    return ts


_LEASE_STATES = {
    LeaseState.FREE: types_pb2.LEASE_STATE_UNASSIGNED,
    LeaseState.GRANTED: types_pb2.LEASE_STATE_GRANTED,
    LeaseState.REVOKING: types_pb2.LEASE_STATE_REVOKING,
}


def lease_message(lease: Lease, now_mono: float, now_wall: float) -> types_pb2.Lease:
    proto = types_pb2.Lease(
        topic=lease.tp.topic,
        partition=lease.tp.partition,
        holder=lease.holder or "",
        epoch=lease.epoch,
        state=_LEASE_STATES.get(lease.state, types_pb2.LEASE_STATE_UNASSIGNED),
    )
    if lease.holder is not None:
        proto.expires_at.CopyFrom(wall_timestamp(lease.expires_at, now_mono, now_wall))
    return proto


def member_message(
    member: MemberInfo,
    now_mono: float,
    now_wall: float,
    *,
    config: MemberConfig | None = None,
    drained: bool = False,
) -> types_pb2.Member:
    """``config``: the group's consumer config as the member last reported running it."""
    proto = types_pb2.Member(
        sidecar_id=member.id,
        endpoint=member.endpoint,
        zone=member.zone or "",
        capacity=member.capacity or 0,
        drained=drained,
    )
    if config is not None:
        proto.applied_config_version = config.applied_version
        if config.rejection is not None:
            proto.config_rejection.config_version = config.rejection[0]
            proto.config_rejection.reason = config.rejection[1]
    if member.joined_at:
        proto.joined_at.CopyFrom(wall_timestamp(member.joined_at, now_mono, now_wall))
    if member.last_seen:
        proto.last_heartbeat.CopyFrom(wall_timestamp(member.last_seen, now_mono, now_wall))
    return proto


def client_message(row: ClientRow) -> admin_pb2.ClientView:
    """One client of a group (ListClients)."""
    return admin_pb2.ClientView(
        client_id=row.client_id,
        group=row.group,
        sidecars=[
            admin_pb2.ClientAtSidecar(
                sidecar_id=s.sidecar_id,
                endpoint=s.endpoint,
                records_per_second=s.rates.records,
                acks_per_second=s.rates.acks,
                errors_per_second=s.rates.errors,
                requests_per_second=s.rates.requests,
                last_seen_seconds=s.last_seen,
                active_streams=s.active_streams,
            )
            for s in row.sidecars
        ],
        records_per_second=row.rates.records,
        acks_per_second=row.rates.acks,
        errors_per_second=row.rates.errors,
        error_ratio=row.error_ratio,
        last_seen_seconds=row.last_seen,
        bound=row.bound,
        bound_since_seconds=row.bound_since,
    )
