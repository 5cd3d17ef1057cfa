"""Consul down with two assigner replicas: consumption does not stop (issue 17, path 4;
chaos scenario 3).

Before fenced state writes, a leader that could not reach Consul for 5 s resigned while
nobody could be elected, so a Consul outage stopped every group's consumption within a
lease TTL. Now the leader leads on while its state writes confirm its term (a write under
the state topic's transactional id, which a newer leader's term would fence), so leases
keep being renewed and records keep flowing; when Consul is back there is one leader.

A Consul agent of the test's own (the session's agent is shared), paused with SIGSTOP (its
clients' calls hang and time out, as with a network outage), then resumed. Real Kafka, two
assigner replicas, three sidecars, a producer throughout and a ``DsClient`` acking; every
record counted.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import grpc
import pytest

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc
from services.client import DsClient
from services.devstack.consul import ConsulAgent, ConsulOptions
from services.devstack.kafka import KafkaHandle, TopicFactory
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.ops import unexplained_duplicates, wait_for
from tests.support.records import ConsumerLoop, SeqProducer, Tally

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

PARTITIONS = 6
SIDECARS = ("sc-1", "sc-2", "sc-3")


def serving_members(replica: ServiceProcess, group: str) -> set[str] | None:
    """The group's members if this replica leads and serves it, else None."""
    try:
        with grpc.insecure_channel(replica.grpc_addr) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            described = stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=2)
    except grpc.RpcError:
        return None
    return {m.sidecar_id for m in described.members}


def leaders(replicas: list[ServiceProcess], group: str) -> list[ServiceProcess]:
    return [r for r in replicas if serving_members(r, group) is not None]


@pytest.mark.parametrize(
    "outage",
    [pytest.param(20.0, id="20s"), pytest.param(60.0, id="60s", marks=pytest.mark.long)],
)
def test_consul_down_consumption_goes_on(
    kafka_cluster: KafkaHandle, tmp_path: Path, outage: float
) -> None:
    agent = ConsulAgent(ConsulOptions(base_dir=tmp_path / "consul")).start()
    topics = TopicFactory(kafka_cluster.bootstrap, "consul-outage")
    topic = topics(PARTITIONS)
    group = f"co-{uuid.uuid4().hex[:8]}"
    producer = SeqProducer(kafka_cluster.bootstrap, topic, PARTITIONS, rate=200.0).start()
    paused = False
    try:
        with running_mesh(kafka_cluster.bootstrap, tmp_path, consul=agent.http_addr) as mesh:
            replicas = [mesh.assigner([(group, [topic])], name=f"assigner-{i}") for i in (1, 2)]
            for replica in replicas:
                replica.wait_serving(90)
            wait_for(lambda: len(leaders(replicas, group)) == 1, 60, "a leader serves the group")
            (leader,) = leaders(replicas, group)
            sidecars = [mesh.sidecar(group, leader, sid) for sid in SIDECARS]
            for sidecar in sidecars:
                sidecar.wait_serving(90)
            wait_for(lambda: serving_members(leader, group) == set(SIDECARS), 60, "sidecars joined")
            with DsClient(
                group, client_id="co-app", assigner=leader.grpc_addr, consul=agent.http_addr
            ) as client:
                tally = Tally()
                loop = ConsumerLoop(client, tally).start()
                wait_for(lambda: len(tally.received()) > 300, 60, "records flowing")

                assert agent.pid is not None
                os.kill(agent.pid, signal.SIGSTOP)
                paused = True
                stopped_at = time.monotonic()
                # Records keep arriving in every tenth of the outage.
                windows = []
                step = outage / 10
                for _ in range(10):
                    before = len(tally.received())
                    time.sleep(step)
                    windows.append(len(tally.received()) - before)
                during = leaders(replicas, group)
                os.kill(agent.pid, signal.SIGCONT)
                paused = False
                resumed_at = time.monotonic()
                gap, gap_at = tally.longest_gap(stopped_at, resumed_at)

                wait_for(lambda: len(leaders(replicas, group)) == 1, 60, "one leader after")
                (after,) = leaders(replicas, group)
                wait_for(
                    lambda: serving_members(after, group) == set(SIDECARS),
                    60,
                    "every sidecar attached to the leader after the outage",
                )
                time.sleep(3)
                confirmed = producer.confirmed()
                wait_for(lambda: not (confirmed - tally.received()), 60, "every record received")
                loop.stop()
            logs = {s.log.stem: s.log.read_text(errors="replace") for s in sidecars}
            leader_log = leader.log.read_text(errors="replace")
    finally:
        if paused and agent.pid is not None:
            os.kill(agent.pid, signal.SIGCONT)
        producer.stop()
        topics.delete_all()
        agent.stop()

    expired = sum(text.count("lease expired locally") for text in logs.values())
    duplicates = tally.duplicate_count()
    print(
        f"chaos consul down {outage:.0f}s (2 assigner replicas): produced {len(confirmed)}, "
        f"received {len(tally.received())}, lost {len(confirmed - tally.received())}, "
        f"duplicates {duplicates} (unexplained {len(unexplained_duplicates(tally))}); "
        f"records per tenth of the outage {windows}; longest gap during it {gap:.2f}s at "
        f"+{gap_at - stopped_at:.1f}s; leases expired locally {expired}; leader during the "
        f"outage {[r.log.stem for r in during]}, after {after.log.stem}; client errors "
        f"{loop.errors}"
    )
    assert loop.errors == []
    assert [r.grpc_addr for r in during] == [leader.grpc_addr], "the leader led on"
    assert "Consul unreachable: leading on" in leader_log
    assert all(n > 0 for n in windows), f"consumption stopped during the outage: {windows}"
    assert expired == 0, "no lease lapsed: the leader kept renewing them"
    assert not (confirmed - tally.received()), "records lost"
    assert unexplained_duplicates(tally) == {}
    assert duplicates == 0
