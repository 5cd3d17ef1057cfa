"""What the coordinator's unit tests share: a member, and the grants, revokes and holders
an event or a coordinator shows."""

from __future__ import annotations

from services.assigner.coordinator import (
    GrantCmd,
    GroupCoordinator,
    MemberInfo,
    Outcome,
    RevokeCmd,
)
from services.runtime.topic_partition import TopicPartition


def member(mid: str) -> MemberInfo:
    return MemberInfo(id=mid, endpoint=f"{mid}:1", session_id=f"s-{mid}")


def grants(out: Outcome) -> list[GrantCmd]:
    return [c for c in out.commands if isinstance(c, GrantCmd)]


def revokes(out: Outcome) -> list[RevokeCmd]:
    return [c for c in out.commands if isinstance(c, RevokeCmd)]


def holders(coord: GroupCoordinator) -> dict[TopicPartition, str | None]:
    return {tp: lease.holder for tp, lease in coord.leases.items()}
