"""The assigner leader stalled (SIGSTOP) for 20 s, then resumed (issue 17, chaos
scenario 4): a standby leads, the stalled leader is fenced and steps down when it wakes,
no partition has two live holders at any sampled moment, and no record is lost.

Real Kafka and Consul, two assigner replicas, three sidecars, a producer throughout and a
``DsClient`` acking; every sidecar's held leases are sampled every 100 ms through its
``Status`` RPC.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import grpc
import pytest

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc
from services.client import DsClient
from services.devstack.kafka import KafkaHandle, TopicFactory
from tests.support.holders import HolderSampler
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.ops import unexplained_duplicates, wait_for
from tests.support.records import ConsumerLoop, SeqProducer, Tally

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

PARTITIONS = 6
SIDECARS = ("st-1", "st-2", "st-3")
STALL = 20.0


def serving_members(replica: ServiceProcess, group: str) -> set[str] | None:
    try:
        with grpc.insecure_channel(replica.grpc_addr) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            described = stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=2)
    except grpc.RpcError:
        return None
    return {m.sidecar_id for m in described.members}


def test_stalled_leader_is_replaced_fenced_and_steps_down(
    kafka_cluster: KafkaHandle, consul_agent: object, tmp_path: Path
) -> None:
    consul: str = consul_agent.http_addr  # type: ignore[attr-defined]
    topics = TopicFactory(kafka_cluster.bootstrap, "stall")
    topic = topics(PARTITIONS)
    group = f"stall-{uuid.uuid4().hex[:8]}"
    producer = SeqProducer(kafka_cluster.bootstrap, topic, PARTITIONS, rate=200.0).start()
    stalled: ServiceProcess | None = None
    try:
        with running_mesh(kafka_cluster.bootstrap, tmp_path, consul=consul) as mesh:
            replicas = [mesh.assigner([(group, [topic])], name=f"assigner-{i}") for i in (1, 2)]
            for replica in replicas:
                replica.wait_serving(90)

            def leaders() -> list[ServiceProcess]:
                return [r for r in replicas if serving_members(r, group) is not None]

            wait_for(lambda: len(leaders()) == 1, 60, "a leader serves the group")
            (leader,) = leaders()
            (standby,) = (r for r in replicas if r is not leader)
            sidecars = [mesh.sidecar(group, leader, sid) for sid in SIDECARS]
            for sidecar in sidecars:
                sidecar.wait_serving(90)
            wait_for(lambda: serving_members(leader, group) == set(SIDECARS), 60, "joined")
            with (
                DsClient(
                    group, client_id="stall-app", assigner=leader.grpc_addr, consul=consul
                ) as client,
                HolderSampler(sidecars) as sampler,
            ):
                tally = Tally()
                loop = ConsumerLoop(client, tally).start()
                wait_for(lambda: len(tally.received()) > 300, 60, "records flowing")

                leader.signal(signal.SIGSTOP)
                stalled = leader
                stopped_at = time.monotonic()
                wait_for(lambda: serving_members(standby, group) is not None, 30, "standby leads")
                took_over = time.monotonic() - stopped_at
                wait_for(
                    lambda: serving_members(standby, group) == set(SIDECARS),
                    60,
                    "every sidecar attached to the new leader",
                )
                time.sleep(max(0.0, STALL - (time.monotonic() - stopped_at)))
                leader.signal(signal.SIGCONT)
                stalled = None
                wait_for(
                    lambda: "lost leadership" in leader.log.read_text(errors="replace"),
                    30,
                    "the old leader steps down",
                )
                time.sleep(3)
                after = leaders()
                confirmed = producer.confirmed()
                wait_for(lambda: not (confirmed - tally.received()), 60, "every record received")
                loop.stop()
            old_log = leader.log.read_text(errors="replace")
    finally:
        if stalled is not None:
            stalled.signal(signal.SIGCONT)
        producer.stop()
        topics.delete_all()

    duplicates = tally.duplicate_count()
    lost_line = next(line for line in old_log.splitlines() if "lost leadership" in line)
    print(
        f"chaos assigner leader SIGSTOP {STALL:.0f}s: produced {len(confirmed)}, received "
        f"{len(tally.received())}, lost {len(confirmed - tally.received())}, duplicates "
        f"{duplicates} (unexplained {len(unexplained_duplicates(tally))}); standby led "
        f"{took_over:.2f}s after the stop; holder samples {sampler.samples}, with two live "
        f"holders {len(sampler.double)}; leader after {[r.log.stem for r in after]}; the old "
        f"leader on waking: {lost_line.split('[warning  ]')[-1].strip()[:160]}; client errors "
        f"{loop.errors}"
    )
    assert loop.errors == []
    assert [r.grpc_addr for r in after] == [standby.grpc_addr]
    assert sampler.samples > 50
    assert sampler.double == [], f"two live holders: {sampler.double[:5]}"
    assert not (confirmed - tally.received()), "records lost"
    assert unexplained_duplicates(tally) == {}
