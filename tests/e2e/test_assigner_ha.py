"""Assigner high availability (issue "Assigner", item 7; ARCHITECTURE §3 "Leaders", §6).

With Consul and two assigner replicas, a kill -9 of the leader: the standby leads within
3 s, and sidecars and clients follow it without a restart — the same sidecar processes
re-attach to the new leader, and a client keeps fetching (every record produced before and
after the failover arrives) without handling an error.

Until durable assigner state lands, both replicas declare the group in their YAML, so the
new leader knows it; the sidecars' re-joins report the leases they hold.
"""

from __future__ import annotations

import time
from pathlib import Path

import consul
import grpc
import pytest

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc
from dsclient import DsClient
from dsclient.leader_watch import DEFAULT_LEADER_KEY, read_leader
from dsclient.reasons import LEADER_METADATA_KEY, error_info, trailing_value
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.producing import produce
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 6
FAILOVER_BUDGET_SECONDS = 3.0


def list_groups(address: str) -> admin_pb2.ListGroupsResponse:
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        response: admin_pb2.ListGroupsResponse = stub.ListGroups(
            admin_pb2.ListGroupsRequest(), timeout=1
        )
        return response


def accepts_admin(address: str) -> bool | None:
    try:
        list_groups(address)
        return True
    except grpc.RpcError:
        return None


def refused(replica: ServiceProcess) -> grpc.RpcError | None:
    """The follower's refusal, once it names a leader."""
    try:
        list_groups(replica.grpc_addr)
    except grpc.RpcError as err:
        return err if trailing_value(err, LEADER_METADATA_KEY) else None
    raise AssertionError(f"{replica.grpc_addr} answered as a leader")


def members(address: str, group: str) -> set[str] | None:
    """The group's members as this replica sees them; None unless it leads and serves it."""
    try:
        with grpc.insecure_channel(address) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            response = stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=2)
    except grpc.RpcError:
        return None
    return {m.sidecar_id for m in response.members}


def fetch_until(client: DsClient, wanted: set[int], received: set[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not wanted <= received and time.monotonic() < deadline:
        batch = client.fetch(max_records=500, max_wait=0.5)
        received.update(int(r.key) for r in batch)
        client.ack(batch)
    missing = wanted - received
    assert not missing, f"{len(missing)} records never arrived, e.g. {sorted(missing)[:10]}"


def test_kill_leader_standby_leads_and_everyone_follows(
    kafka_cluster: object, consul_agent: object, topic_factory: object, tmp_path: Path
) -> None:
    bootstrap: str = kafka_cluster.bootstrap  # type: ignore[attr-defined]
    consul_addr: str = consul_agent.http_addr  # type: ignore[attr-defined]
    host, port = consul_addr.rsplit(":", 1)
    kv = consul.Consul(host=host, port=int(port))
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"

    with running_mesh(bootstrap, tmp_path, consul=consul_addr) as mesh:
        replicas = [mesh.assigner([(group, [topic])]) for _ in range(2)]
        for replica in replicas:
            replica.wait_serving()
        by_address = {r.grpc_addr: r for r in replicas}
        leader_addr = wait_for(
            lambda: a if (a := read_leader(kv, DEFAULT_LEADER_KEY)) in by_address else None,
            30,
            "a leader elected",
            every=0.1,
        )
        leader = by_address[leader_addr]
        (standby,) = (r for r in replicas if r is not leader)

        # The follower refuses with NOT_LEADER and names the leader (once it has seen the
        # key: at start-up it may still be waiting for its own health check to pass).
        refusal = wait_for(lambda: refused(standby), 10, "the follower names the leader", 0.1)
        assert refusal.code() == grpc.StatusCode.FAILED_PRECONDITION
        info = error_info(refusal)
        assert info is not None and info.reason == "NOT_LEADER"
        assert trailing_value(refusal, LEADER_METADATA_KEY) == leader_addr

        # Sidecars are pointed at the *standby*: they must find the leader by themselves.
        sidecars: list[ServiceProcess] = [
            mesh.sidecar(group, standby, f"ha-sidecar-{i}") for i in range(2)
        ]
        for sidecar in sidecars:
            sidecar.wait_serving()
        pids = [s.proc.pid for s in sidecars if s.proc is not None]
        ids = {"ha-sidecar-0", "ha-sidecar-1"}
        wait_for(lambda: members(leader_addr, group) == ids, 30, "sidecars joined", every=0.1)

        before = range(0, 600)
        produce(bootstrap, topic, before, value=lambda seq: f"v{seq}".encode())
        received: set[int] = set()
        with DsClient(
            group, client_id="ha-app", assigner=standby.grpc_addr, consul=consul_addr
        ) as client:
            assert client.assigner == leader_addr
            fetch_until(client, set(before), received, timeout=60)

            killed_at = time.monotonic()
            leader.kill()
            wait_for(lambda: accepts_admin(standby.grpc_addr), 10, "the standby is elected", 0.02)
            elected = time.monotonic() - killed_at
            assert read_leader(kv, DEFAULT_LEADER_KEY) == standby.grpc_addr
            # Leading = serving the group (DescribeGroup answers), not just holding the lock.
            wait_for(
                lambda: members(standby.grpc_addr, group) is not None,
                10,
                "the standby serves the group",
                0.02,
            )
            failover = time.monotonic() - killed_at
            print(f"failover: elected {elected:.2f}s, serving {failover:.2f}s after kill -9")
            assert failover < FAILOVER_BUDGET_SECONDS, f"failover took {failover:.2f}s"

            rejoined = wait_for(
                lambda: (
                    time.monotonic() - killed_at
                    if members(standby.grpc_addr, group) == ids
                    else None
                ),
                30,
                "sidecars re-attached to the new leader",
                every=0.1,
            )
            print(f"both sidecars re-attached {rejoined:.2f}s after kill -9")

            after = range(600, 1200)
            produce(bootstrap, topic, after, value=lambda seq: f"v{seq}".encode())
            fetch_until(client, set(after), received, timeout=60)
            assert client.assigner == standby.grpc_addr

        # The same sidecar processes, never restarted.
        assert [s.proc.pid for s in sidecars if s.proc is not None] == pids
        assert all(s.proc is not None and s.proc.poll() is None for s in sidecars)
