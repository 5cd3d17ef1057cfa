"""Leased groups on the real stack: their config (commit fencing, their own lease timing:
issue 36), created with the Admin API, and how long a killed sidecar's partitions took to
be taken over by the survivor."""

from __future__ import annotations

import time

import grpc
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from tests.support.assignment import Assignment, describe


def dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def group_config(
    name: str,
    topic: str,
    fencing: types_pb2.CommitFencing.ValueType,
    ttl: float | None = None,
    beat: float | None = None,
) -> types_pb2.GroupConfig:
    """A leased group of ``topic``, commit-fenced by ``fencing``, with its own lease TTL and
    heartbeat interval when given (else the assigner's)."""
    cfg = types_pb2.GroupConfig(
        name=name, topics=[topic], mode=common_pb2.GROUP_MODE_LEASED, commit_fencing=fencing
    )
    if ttl is not None:
        cfg.lease_ttl.CopyFrom(dur(ttl))
    if beat is not None:
        cfg.heartbeat_interval.CopyFrom(dur(beat))
    return cfg


def create_group(
    admin: admin_pb2_grpc.AdminServiceStub, config: types_pb2.GroupConfig
) -> types_pb2.GroupConfig:
    """The group as CreateGroup stored it (grpc.RpcError when refused)."""
    return admin.CreateGroup(admin_pb2.CreateGroupRequest(group=config), timeout=30).group


def victims(before: Assignment, survivor: str) -> set[int]:
    """The partitions ``before`` had on other sidecars than ``survivor``."""
    return {p for p, lease in before.items() if lease.holder != survivor}


def taken_over(assigner: str, group: str, before: Assignment, survivor: str) -> bool:
    """Every partition of ``group`` granted to ``survivor``, those it did not hold in
    ``before`` with a newer epoch; False too when the assigner does not answer."""
    moved = victims(before, survivor)
    try:
        view = describe(assigner, group, timeout=1.0)
    except grpc.RpcError:
        return False
    return all(
        lease.granted
        and lease.holder == survivor
        and (p not in moved or lease.epoch > before[p].epoch)
        for p, lease in view.leases.items()
    )


def takeover_seconds(
    assigner: str,
    befores: dict[str, Assignment],
    survivors: dict[str, str],
    killed_at: float,
    within: float = 60,
) -> dict[str, float]:
    """For each group of ``befores``, the seconds from ``killed_at`` (time.monotonic) until
    its survivor had taken it over (:func:`taken_over`); a group not taken over within
    ``within`` s of ``killed_at`` is left out."""
    taken: dict[str, float] = {}
    deadline = killed_at + within
    while len(taken) < len(befores) and time.monotonic() < deadline:
        for group, before in befores.items():
            if group not in taken and taken_over(assigner, group, before, survivors[group]):
                taken[group] = time.monotonic() - killed_at
        time.sleep(0.05)
    return taken
