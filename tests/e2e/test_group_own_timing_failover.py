"""A kafka-fenced group's own lease TTL and heartbeat interval (issue 36 item 2), on the
real stack: one assigner (default TTL 3 s, heartbeat 1 s), two kafka-fenced groups side
by side, one with TTL 1.5 s / heartbeat 0.5 s, one with the assigner's. One sidecar of
each hangs (SIGSTOP: its socket stays open, so only the missing heartbeats tell) at the
same moment: both groups' partitions are taken over by the survivor with new epochs; the
gaps are printed (and the short group's is expected to be the smaller one, asserted only
as an order with a wide margin of the defaults' own difference). A lease-fenced group
asking for a short TTL is INVALID_ARGUMENT (a live change of a kafka-fenced group's:
tests/e2e/test_group_timing_live_change.py).

A killed sidecar is found sooner, whatever its TTL: its kernel closes its Session stream,
and after the assigner's reconnect window (1 s) its Kafka-fenced leases move at once;
a lease-fenced group's wait for their expiry (the second test)."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import admin_pb2_grpc, types_pb2
from services.devstack.kafka import TopicFactory
from tests.support.assignment import wait_stable
from tests.support.leased_groups import (
    create_group,
    group_config,
    takeover_seconds,
    victims,
)
from tests.support.mesh import Mesh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PARTITIONS = 2


def seconds(d: duration_pb2.Duration) -> float:
    return d.ToTimedelta().total_seconds()


def test_a_short_ttl_kafka_group_notices_a_hung_sidecar_sooner_than_a_default_one(
    mesh: Mesh, topic_factory: TopicFactory, own_state: dict[str, str]
) -> None:
    topic_s, topic_d = topic_factory(partitions=PARTITIONS), topic_factory(partitions=PARTITIONS)
    short, default = f"gs-{topic_s}", f"gd-{topic_d}"
    assigner = mesh.assigner(env=own_state)
    assigner.wait_serving()
    kafka, lease = types_pb2.COMMIT_FENCING_KAFKA, types_pb2.COMMIT_FENCING_LEASE
    with grpc.insecure_channel(assigner.grpc_addr) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        created = create_group(admin, group_config(short, topic_s, kafka, 1.5, 0.5))
        assert (seconds(created.lease_ttl), seconds(created.heartbeat_interval)) == (1.5, 0.5)
        created = create_group(admin, group_config(default, topic_d, kafka))
        assert seconds(created.lease_ttl) == 3.0

        # Not for a lease-fenced group.
        with pytest.raises(grpc.RpcError) as refused:
            create_group(admin, group_config(f"gl-{topic_s}", topic_s, lease, 1.5, 0.5))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        print(f"\nrefused: {refused.value.details()}")

    sidecars = {
        short: [mesh.sidecar(short, assigner, f"ss-{i}") for i in (1, 2)],
        default: [mesh.sidecar(default, assigner, f"sd-{i}") for i in (1, 2)],
    }
    for svcs in sidecars.values():
        for svc in svcs:
            svc.wait_serving()
    before = {
        short: wait_stable(assigner.grpc_addr, short, ["ss-1", "ss-2"], PARTITIONS),
        default: wait_stable(assigner.grpc_addr, default, ["sd-1", "sd-2"], PARTITIONS),
    }
    survivor = {short: "ss-1", default: "sd-1"}
    victim_parts = {g: victims(before[g], survivor[g]) for g in before}
    assert all(victim_parts.values())

    sidecars[short][1].signal(signal.SIGSTOP)
    sidecars[default][1].signal(signal.SIGSTOP)
    killed_at = time.monotonic()
    taken = takeover_seconds(assigner.grpc_addr, before, survivor, killed_at)
    sidecars[short][1].kill()  # a stopped process takes SIGKILL at once
    sidecars[default][1].kill()
    print(
        f"SIGSTOP: short group (TTL 1.5 s, heartbeat 0.5 s) taken over after "
        f"{taken.get(short, float('nan')):.2f}s; default group (TTL 3 s, heartbeat 1 s) "
        f"after {taken.get(default, float('nan')):.2f}s"
    )
    assert set(taken) == {short, default}, f"not taken over within 60 s: {taken}"
    # TTL + grace: 2.5 s against 4 s; the victims were killed within milliseconds of each
    # other and both groups are expired by the same tick loop, so the order is robust.
    assert taken[short] < taken[default]


def test_a_killed_sidecars_kafka_fenced_leases_move_when_its_session_closes(
    mesh: Mesh, topic_factory: TopicFactory, own_state: dict[str, str]
) -> None:
    """kill -9 of one sidecar in a kafka-fenced group and one in a lease-fenced group, both
    at the assigner's default timing (TTL 3 s + grace 1 s, heartbeat 1 s): the kafka
    group's partitions move once the reconnect window has passed (the assigner says why),
    the lease group's at their expiry. Asserted as an order (a 1 s window against 3-4 s)."""
    topic_k, topic_l = topic_factory(partitions=PARTITIONS), topic_factory(partitions=PARTITIONS)
    kgroup, lgroup = f"gk-{topic_k}", f"gl-{topic_l}"
    assigner = mesh.assigner(env=own_state)
    assigner.wait_serving()
    kafka, lease = types_pb2.COMMIT_FENCING_KAFKA, types_pb2.COMMIT_FENCING_LEASE
    with grpc.insecure_channel(assigner.grpc_addr) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        create_group(admin, group_config(kgroup, topic_k, kafka))
        create_group(admin, group_config(lgroup, topic_l, lease))
    sidecars = {
        kgroup: [mesh.sidecar(kgroup, assigner, f"sk-{i}") for i in (1, 2)],
        lgroup: [mesh.sidecar(lgroup, assigner, f"sl-{i}") for i in (1, 2)],
    }
    for svcs in sidecars.values():
        for svc in svcs:
            svc.wait_serving()
    before = {
        kgroup: wait_stable(assigner.grpc_addr, kgroup, ["sk-1", "sk-2"], PARTITIONS),
        lgroup: wait_stable(assigner.grpc_addr, lgroup, ["sl-1", "sl-2"], PARTITIONS),
    }
    survivor = {kgroup: "sk-1", lgroup: "sl-1"}
    assert all(victims(before[g], survivor[g]) for g in before)
    # The heartbeats that report the kafka group's leases fenced at Kafka have come.
    time.sleep(2.0)

    sidecars[kgroup][1].kill()
    sidecars[lgroup][1].kill()
    killed_at = time.monotonic()
    taken = takeover_seconds(assigner.grpc_addr, before, survivor, killed_at)
    print(
        f"kill -9, default timing: kafka-fenced group taken over after "
        f"{taken.get(kgroup, float('nan')):.2f}s; lease-fenced group after "
        f"{taken.get(lgroup, float('nan')):.2f}s"
    )
    assert set(taken) == {kgroup, lgroup}, f"not taken over within 60 s: {taken}"
    assert taken[kgroup] < taken[lgroup]
    log = assigner.log.read_text(errors="replace")
    gone = [line for line in log.splitlines() if "sidecar gone: its session ended" in line]
    assert any("sk-2" in line for line in gone), assigner.tail()
