"""A sidecar's word never moves an offset (issue 37, finding 3).

Only an admin credential moves offsets (ARCHITECTURE §8). The offsets a sidecar reports in
its heartbeats (``committed_offset`` of its leases and of its releases) and the external
commits it reports (``external_commits``) are its claims: the next holder of a partition
starts at what Kafka holds, and an external commit is followed only when Kafka shows it.
On the real servicers (in-process, Kafka at its narrow edges, ``rpc_harness``).
"""

from __future__ import annotations

import asyncio

from dataservice.assigner.v1 import assigner_pb2
from services.assigner.coordinator import COMMITTED
from services.runtime.topic_partition import TopicPartition
from tests.support.rpc_operations import commands, holding, logs, release
from tests.unit.assigner.rpc_harness import TOPIC, Assigner, Sidecar, run


async def handed_over(a: Assigner, committed: int) -> list[assigner_pb2.LeaseGrant]:
    """sc-1 holds every partition; sc-2 joins and takes its share, which sc-1 releases
    reporting ``committed``; sc-2's grants."""
    one, _ = await holding(a, "sc-1")
    two = Sidecar(a.sessions, "sc-2")
    await two.join("g")
    revokes = [m.revoke for m in await commands(one, "revoke", 2)]
    await release(one, revokes, committed=committed)
    grants = await two.grants(2)
    await one.close()
    await two.close()
    return grants


def test_a_release_reporting_an_offset_kafka_does_not_hold_does_not_move_the_next_start() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        logs(a)  # Kafka: the group committed 60 on every partition
        grants = await handed_over(a, committed=99_999)
        starts = [g.start_offset for g in grants]
        print("released at 99999 (Kafka: 60); the next holder starts at", starts)
        assert {g.start_offset for g in grants} == {COMMITTED}, "what Kafka holds, not the report"
        assert a.offsets.commits == []

    run(body)


def test_a_heartbeat_reporting_progress_does_not_set_the_next_holders_start() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        logs(a)
        one, grants = await holding(a, "sc-1")
        one.seq += 1
        await one.call.write(
            assigner_pb2.SessionRequest(
                heartbeat=assigner_pb2.SessionHeartbeat(
                    seq=one.seq,
                    leases=[
                        assigner_pb2.LeaseProgress(
                            topic=g.topic, partition=g.partition, epoch=g.epoch,
                            committed_offset=5,
                        )
                        for g in grants
                    ],
                )
            )
        )  # fmt: skip
        await commands(one, "heartbeat_ack", 1)
        two = Sidecar(a.sessions, "sc-2")
        await two.join("g")
        revokes = [m.revoke for m in await commands(one, "revoke", 2)]
        await release(one, revokes, committed=-1)
        moved = await two.grants(2)
        assert {g.start_offset for g in moved} == {COMMITTED}
        await one.close()
        await two.close()

    run(body)


def test_an_external_commit_is_followed_only_when_kafka_shows_it() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        logs(a)
        forged, real = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
        a.offsets.committed[("g", real)] = 30  # kafka-consumer-groups --reset-offsets
        sidecar, grants = await holding(a, "sc-1")
        epoch = {g.partition: g.epoch for g in grants}
        sidecar.seq += 1
        await sidecar.call.write(
            assigner_pb2.SessionRequest(
                heartbeat=assigner_pb2.SessionHeartbeat(
                    seq=sidecar.seq,
                    leases=[
                        assigner_pb2.LeaseProgress(
                            topic=g.topic, partition=g.partition, epoch=g.epoch
                        )
                        for g in grants
                    ],
                    external_commits=[
                        assigner_pb2.ExternalCommit(
                            topic=TOPIC, partition=tp.partition, epoch=epoch[tp.partition],
                            previous_offset=60, committed_offset=offset,
                        )
                        for tp, offset in ((forged, 99_999), (real, 30))
                    ],
                )
            )
        )  # fmt: skip
        # The real one is followed: paused, released, committed under a new epoch, back.
        revokes = [m.revoke for m in await commands(sidecar, "revoke", 1)]
        assert [(r.partition, r.reason) for r in revokes] == [
            (1, assigner_pb2.REVOKE_REASON_CONFIG)
        ]
        await release(sidecar, revokes, committed=60)
        (back,) = [m.grant for m in await commands(sidecar, "grant", 1)]
        await asyncio.sleep(0.3)  # past the reports' gathering: the forged one had its turn
        print("reported external commits 99999 (Kafka: 60) and 30 (Kafka: 30); committed:",
              a.offsets.commits)  # fmt: skip
        assert back.partition == 1
        assert a.offsets.commits == [("g", {real: (30, back.epoch)})]
        assert a.offsets.committed[("g", forged)] == 60
        lease = a.groups.group("g").coordinator.leases[forged]
        assert (lease.holder, lease.epoch) == ("sc-1", epoch[0]), "nothing happened to it"
        await sidecar.close()

    run(body)
