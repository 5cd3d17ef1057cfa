"""A reconnect storm against an assigner that rations joins (issue 36, item 3).

A real assigner admitting one join every 50 s (``join_rate`` 0.02, ``join_burst`` 2: the
attached sidecar's join and one of the storm's, retry-after at most 3 s), one real sidecar
attached to a group holding every partition, and a storm of raw ``Session`` joins into a
second group, kept up until a second real sidecar's join into that group has been refused
with JOIN_THROTTLED. The second sidecar starts once the storm has had its one admitted join,
so the bucket is empty for the next 50 s and its first join is refused whatever the load
(CI, 2 Dec: at 1 join/s on a loaded machine the sidecar's join won the second's token and
was never refused). Then: the throttled sidecar backs off and
attaches (it ends up holding the second group's partitions), and the attached sidecar kept
its leases through the storm (same holder, same epochs, no lease expired locally on it).
Nothing about time is asserted; the storm's figures are tests/bench/bench_join_storm.py's.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid

import grpc
import pytest

from dataservice.assigner.v1 import assigner_pb2, assigner_pb2_grpc
from dsclient.reasons import Reason, error_info
from services.devstack.kafka import TopicFactory
from tests.support.assignment import GroupView, describe, wait_until
from tests.support.mesh import Mesh

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 4
THROTTLED = "assigner session failed; reconnecting"


class Storm(threading.Thread):
    """Fresh joins (no held leases) into ``group``, one after another on one channel,
    until stopped; counts the refusals. An admitted join's stream is left open (a member
    that never heartbeats: the assigner drops it after TTL + grace)."""

    def __init__(self, addr: str, group: str) -> None:
        super().__init__(daemon=True)
        self.addr, self.group = addr, group
        self.stopping = threading.Event()
        self.refused = self.admitted = 0
        self.calls: list[grpc.Future] = []

    def run(self) -> None:
        with grpc.insecure_channel(self.addr) as channel:
            stub = assigner_pb2_grpc.AssignerServiceStub(channel)
            n = 0
            while not self.stopping.is_set():
                n += 1
                outbox: queue.Queue[assigner_pb2.SessionRequest | None] = queue.Queue()
                outbox.put(
                    assigner_pb2.SessionRequest(
                        join=assigner_pb2.SessionJoin(
                            sidecar_id=f"storm-{n}", group=self.group, endpoint="127.0.0.1:1"
                        )
                    )
                )
                call = stub.Session(iter(outbox.get, None), timeout=60)
                try:
                    next(call)
                    self.admitted += 1
                    self.calls.append(call)
                except grpc.RpcError as err:
                    info = error_info(err)
                    if info is not None and info.reason == Reason.JOIN_THROTTLED:
                        self.refused += 1
                    time.sleep(0.05)
            for call in self.calls:
                call.cancel()


def own_state() -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return {
        "DS_STATE_TOPIC": f"__ds_assigner_state_storm_{suffix}",
        "DS_STATE_TRANSACTIONAL_ID": f"ds-assigner-state-storm-{suffix}",
    }


def test_a_throttled_join_backs_off_and_attaches_and_an_attached_sidecar_keeps_its_leases(
    mesh: Mesh, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    suffix = uuid.uuid4().hex[:6]
    attached_group, storm_group = f"storm-attached-{suffix}", f"storm-joins-{suffix}"
    assigner = mesh.assigner(
        [(attached_group, [topic]), (storm_group, [topic])],
        env={
            **own_state(),
            "DS_JOIN_RATE": "0.02",
            "DS_JOIN_BURST": "2",
            "DS_JOIN_MAX_RETRY_AFTER_SECONDS": "3",
        },
    )
    assigner.wait_serving(90)
    holder = mesh.sidecar(attached_group, assigner, "sc-held")

    def all_held_by(sidecar: str):  # type: ignore[no-untyped-def]
        def check(view: GroupView) -> bool:
            return len(view.leases) == PARTITIONS and all(
                lease.granted and lease.holder == sidecar for lease in view.leases.values()
            )

        return check

    _, before = wait_until(assigner.grpc_addr, attached_group, all_held_by("sc-held"), 90)

    storm = Storm(assigner.grpc_addr, storm_group)
    storm.start()
    late = None
    try:
        # Once the storm has emptied the bucket (its one admitted join, then refusals), a
        # real sidecar joins the storm's group: no token comes for the next 50 s.
        deadline = time.monotonic() + 60
        while (storm.refused < 5 or storm.admitted < 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert storm.admitted >= 1, "the storm's first join was not admitted"
        assert storm.refused >= 5, "the storm's joins were never refused"
        late = mesh.sidecar(storm_group, assigner, "sc-late")
        deadline = time.monotonic() + 60
        while THROTTLED not in late.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the late sidecar's join was never refused"
            time.sleep(0.2)
    finally:
        storm.stopping.set()
        storm.join(30)

    throttled_lines = [
        line
        for line in late.log.read_text(errors="replace").splitlines()
        if THROTTLED in line and "JOIN_THROTTLED" in line
    ]
    assert throttled_lines, "the late sidecar's refusal was not JOIN_THROTTLED"
    # It backs off and attaches: it ends up holding the storm group's partitions.
    wait_until(assigner.grpc_addr, storm_group, all_held_by("sc-late"), 120)

    after = describe(assigner.grpc_addr, attached_group)
    print(
        f"storm: {storm.refused} joins refused (JOIN_THROTTLED), {storm.admitted} admitted; "
        f"the late sidecar refused {len(throttled_lines)} times, then attached; "
        f"attached sidecar's leases before {sorted((p, v.epoch) for p, v in before.leases.items())}"
        f", after {sorted((p, v.epoch) for p, v in after.leases.items())}"
    )
    assert after.leases == before.leases, "the attached sidecar's leases changed in the storm"
    assert "lease expired locally" not in holder.log.read_text(errors="replace")
    assert "revoke" not in holder.log.read_text(errors="replace").lower()
