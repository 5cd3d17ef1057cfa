"""The assigner operations' unit-test helpers: the commands an operator sends, the leases they
hold and release, and the log they leave."""

from __future__ import annotations

from dataservice.assigner.v1 import assigner_pb2
from services.runtime.topic_partition import TopicPartition
from tests.unit.assigner.rpc_harness import (
    TOPIC,
    Assigner,
    Sidecar,
)


def logs(a: Assigner, group: str = "g", partitions: int = 4) -> None:
    """Every partition of TOPIC holds offsets 10..100, the group committed 60."""
    for p in range(partitions):
        tp = TopicPartition(TOPIC, p)
        a.offsets.bounds[tp] = (10, 100)
        a.offsets.committed[(group, tp)] = 60


async def release(
    sidecar: Sidecar, revokes: list[assigner_pb2.LeaseRevoke], committed: int
) -> None:
    """The sidecar's answer to revokes: a heartbeat reporting them released."""
    sidecar.seq += 1
    await sidecar.call.write(
        assigner_pb2.SessionRequest(
            heartbeat=assigner_pb2.SessionHeartbeat(
                seq=sidecar.seq,
                released_leases=[
                    assigner_pb2.ReleasedLease(
                        topic=r.topic, partition=r.partition, epoch=r.epoch,
                        committed_offset=committed,
                    )
                    for r in revokes
                ],
            )
        )
    )  # fmt: skip


async def commands(sidecar: Sidecar, kind: str, count: int) -> list[assigner_pb2.SessionResponse]:
    out: list[assigner_pb2.SessionResponse] = []
    while len(out) < count:
        message = await sidecar.next()
        if message.WhichOneof("kind") == kind:
            out.append(message)
    return out


async def holding(a: Assigner, sidecar_id: str) -> tuple[Sidecar, list[assigner_pb2.LeaseGrant]]:
    """A sidecar of group g holding every partition (epoch 1), renewed."""
    sidecar = Sidecar(a.sessions, sidecar_id)
    await sidecar.join("g")
    grants = await sidecar.grants(4)
    await sidecar.heartbeat(grants)
    return sidecar, grants
