"""Durable assigner state (``__ds_assigner_state``): a restart moves nothing, loses nothing.

A group created through the Admin API survives a kill -9 of the assigner; the restarted
assigner rebuilds groups and epochs from the state topic, re-learns the holders from the
re-attaching sidecars, and neither moves a partition nor lets an epoch go backwards.
"""

from __future__ import annotations

import time

import grpc
import pytest

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dsclient.reasons import error_info
from tests.support.assignment import is_settled, wait_until
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.ops import metric_samples
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

SIDECARS = ("sc-0", "sc-1")


def admin(svc: ServiceProcess) -> admin_pb2_grpc.AdminServiceStub:
    return admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(svc.grpc_addr))


def leases(svc: ServiceProcess, group: str) -> dict[tuple[str, int], tuple[str, int]]:
    response = admin(svc).DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=10)
    return {
        (lease.topic, lease.partition): (lease.holder, lease.epoch) for lease in response.leases
    }


def wait_all_held(svc: ServiceProcess, group: str, partitions: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    current: dict = {}
    while time.monotonic() < deadline:
        try:
            current = leases(svc, group)
        except grpc.RpcError:
            time.sleep(0.3)
            continue
        if len(current) == partitions and all(holder for holder, _ in current.values()):
            return current
        time.sleep(0.3)
    raise AssertionError(f"not every partition held within {timeout}s: {current}")


def wait_in_hand(sidecars: dict[str, ServiceProcess], holders: dict, timeout: float = 30) -> None:
    """Every lease the assigner shows granted has reached its sidecar. The assigner shows a
    grant as soon as it decides it, and sends it once its epoch is durable: a kill in between
    leaves a durable epoch nobody holds, which the restarted assigner rightly grants again
    under a newer one. A grant the sidecar has is named in its re-attach and adopted."""
    want = {sid: {str(p) for (_, p), (h, _) in holders.items() if h == sid} for sid in sidecars}

    def have() -> dict[str, set[str]]:
        return {
            sid: {s.labels["partition"] for s in metric_samples(svc, "ds_sidecar_buffered_records")}
            for sid, svc in sidecars.items()
        }

    wait_for(
        lambda: have() == want, timeout, "grants in the sidecars' hands",
        detail=lambda: f"{have()} != {want}",
    )  # fmt: skip


def restart(svc: ServiceProcess) -> ServiceProcess:
    again = ServiceProcess(svc.kind, svc.args, svc.log, svc.grpc_port, svc.http_port)
    return again.start()


def test_group_and_epochs_survive_an_assigner_kill(mesh: Mesh, topic_factory: object) -> None:
    topic = topic_factory(partitions=8)  # type: ignore[operator]
    group = f"g-{topic}"
    assigner = mesh.assigner()  # no groups in its config: the group comes from the API
    assigner.wait_serving()
    admin(assigner).CreateGroup(
        admin_pb2.CreateGroupRequest(
            group=types_pb2.GroupConfig(
                name=group, topics=[topic], mode=common_pb2.GROUP_MODE_LEASED
            )
        ),
        timeout=10,
    )
    sidecars = [mesh.sidecar(group, assigner, sid) for sid in SIDECARS]
    for sidecar in sidecars:
        sidecar.wait_serving()
    # The handoff between the two sidecars has settled: balanced, every lease granted.
    wait_until(assigner.grpc_addr, group, lambda v: is_settled(v, SIDECARS, 8), timeout=30)
    before = wait_all_held(assigner, group, 8)
    assert {holder for holder, _ in before.values()} == {"sc-0", "sc-1"}
    wait_in_hand(dict(zip(SIDECARS, sidecars, strict=True)), before)
    assert wait_all_held(assigner, group, 8) == before, "settled: nothing moved meanwhile"

    assigner.kill()
    mesh.services.remove(assigner)
    assigner = restart(assigner)
    mesh.services.append(assigner)
    assigner.wait_serving()
    after = wait_all_held(assigner, group, 8)
    time.sleep(5)  # past TTL + grace: the settle period is over, rebalancing is live again
    after = wait_all_held(assigner, group, 8)
    assert after == before, "a restart must move no partition and keep every epoch"

    # Epochs continue from the durable state: a partition that moves now gets a higher one.
    sidecars[0].kill()
    deadline = time.monotonic() + 15
    moved: dict = {}
    while time.monotonic() < deadline:
        moved = leases(assigner, group)
        if all(holder == "sc-1" for holder, _ in moved.values()):
            break
        time.sleep(0.3)
    for tp, (holder, epoch) in moved.items():
        assert holder == "sc-1"
        old_holder, old_epoch = before[tp]
        assert epoch == old_epoch if old_holder == "sc-1" else epoch > old_epoch


def test_unknown_group_is_not_found_with_error_info(mesh: Mesh) -> None:
    assigner = mesh.assigner()
    assigner.wait_serving()
    with pytest.raises(grpc.RpcError) as caught:
        admin(assigner).DescribeGroup(admin_pb2.DescribeGroupRequest(group="no-such"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    info = error_info(caught.value)
    assert info is not None and info.reason == "GROUP_NOT_FOUND"
