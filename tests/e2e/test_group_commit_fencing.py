"""``commit_fencing`` as a group setting (issue 36), on the real stack: one assigner, two
groups created with CreateGroup, one ``kafka`` and one unset, sidecars with the default
process setting (``lease``). A sidecar serves one group, so "two groups on the same
sidecars" means the same sidecar binary and settings, told apart only by the groups'
config.

* Both groups read and ack everything; both commit to the end of the log.
* The ``kafka`` group's sidecar commits through each lease's transactional producer: it
  initialised one per partition at the grant, and when the test initialises a lease's
  ``transactional.id`` itself (as a newer holder would), that sidecar's next commit of the
  partition is refused by Kafka (it drops the lease and is granted it again). The unset
  group's sidecar initialised none, and the same initialisation does nothing to its
  commits (they are plain OffsetCommits, fenced by the lease deadline).
* A live switch of the unset group to ``kafka``: the leases held at the switch keep lease
  fencing (no producer initialised on their holder), a partition granted after it (moved
  to a sidecar that joins) is Kafka-fenced; a switch back to ``lease`` is INVALID_ARGUMENT
  on ``group.commit_fencing``.
"""

from __future__ import annotations

import time

import grpc
import pytest
from confluent_kafka import Producer
from google.protobuf import field_mask_pb2

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dsclient import DsClient
from services.consumer_sidecar.kafka_fenced_commits import transactional_id
from services.devstack.kafka import TopicFactory
from services.runtime.topic_partition import TP
from tests.support import producing
from tests.support.assignment import wait_stable
from tests.support.leased_groups import group_config
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.offsets import committed_offsets

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PARTITIONS = 2
RECORDS = 100  # per topic and round
INITIALISED = "lease commit producer initialised"
REFUSED = "lease commit refused by Kafka"
SWITCHED = "commit fencing: applies to the next grant"


def produce(bootstrap: str, topic: str, ends: dict[int, int]) -> None:
    producing.produce(
        bootstrap,
        topic,
        range(RECORDS),
        value=lambda i: b"v%d" % i,
        idempotent=False,
        delivered=producing.track_ends(ends),
    )


def read_to_the_end(
    mesh: Mesh, assigner: str, group: str, topic: str, ends: dict[int, int], timeout: float = 90
) -> None:
    """Fetch and ack until the group's commits reach ``ends``."""
    deadline = time.monotonic() + timeout
    with DsClient(group, client_id=f"reader-{group}", assigner=assigner) as client:
        while time.monotonic() < deadline:
            batch = client.fetch(max_records=100, max_wait=0.5)
            if batch:
                client.ack(batch)
            elif committed_offsets(mesh.bootstrap, group, topic, PARTITIONS) == ends:
                return
    committed = committed_offsets(mesh.bootstrap, group, topic, PARTITIONS)
    raise AssertionError(f"{group}: committed {committed}, log ends {ends}")


def count(svc: ServiceProcess, text: str) -> int:
    return svc.log.read_text(errors="replace").count(text)


def fence_from_outside(bootstrap: str, group: str, tp: TP) -> None:
    """What a newer holder's grant does: initialise the lease's transactional id."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id(group, tp)}
    )
    producer.init_transactions(30)
    producer.flush(5)


def test_a_kafka_fenced_group_and_a_lease_fenced_group_side_by_side_and_a_live_switch(
    mesh: Mesh, topic_factory: TopicFactory, own_state: dict[str, str]
) -> None:
    topic_k, topic_l = topic_factory(partitions=PARTITIONS), topic_factory(partitions=PARTITIONS)
    group_k, group_l = f"gk-{topic_k}", f"gl-{topic_l}"
    assigner = mesh.assigner(env=own_state)
    assigner.wait_serving()
    with grpc.insecure_channel(assigner.grpc_addr) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        for name, topic, fencing in (
            (group_k, topic_k, types_pb2.COMMIT_FENCING_KAFKA),
            (group_l, topic_l, types_pb2.COMMIT_FENCING_UNSPECIFIED),
        ):
            created = admin.CreateGroup(
                admin_pb2.CreateGroupRequest(group=group_config(name, topic, fencing)), timeout=30
            )
            assert created.group.commit_fencing == fencing

        sc_k = mesh.sidecar(group_k, assigner, "sc-k")
        sc_l = mesh.sidecar(group_l, assigner, "sc-l")
        for svc in (sc_k, sc_l):
            svc.wait_serving()
        wait_stable(assigner.grpc_addr, group_k, ["sc-k"], PARTITIONS)
        wait_stable(assigner.grpc_addr, group_l, ["sc-l"], PARTITIONS)

        ends_k, ends_l = dict.fromkeys(range(PARTITIONS), 0), dict.fromkeys(range(PARTITIONS), 0)
        produce(mesh.bootstrap, topic_k, ends_k)
        produce(mesh.bootstrap, topic_l, ends_l)
        read_to_the_end(mesh, assigner.grpc_addr, group_k, topic_k, ends_k)
        read_to_the_end(mesh, assigner.grpc_addr, group_l, topic_l, ends_l)
        assert (count(sc_k, INITIALISED), count(sc_l, INITIALISED)) == (PARTITIONS, 0)

        # A newer holder's initialisation of partition 0's id, for either group.
        fence_from_outside(mesh.bootstrap, group_k, TP(topic_k, 0))
        fence_from_outside(mesh.bootstrap, group_l, TP(topic_l, 0))
        produce(mesh.bootstrap, topic_k, ends_k)
        produce(mesh.bootstrap, topic_l, ends_l)
        read_to_the_end(mesh, assigner.grpc_addr, group_l, topic_l, ends_l)
        read_to_the_end(mesh, assigner.grpc_addr, group_k, topic_k, ends_k)
        refused_k, refused_l = count(sc_k, REFUSED), count(sc_l, REFUSED)
        assert refused_k >= 1, "the kafka group's commit went through the fenced producer"
        assert refused_l == 0
        # The refused lease was dropped and granted again: its id initialised once more.
        assert count(sc_k, INITIALISED) > PARTITIONS
        print(
            f"\nkafka group: {count(sc_k, INITIALISED)} lease producers initialised, "
            f"{refused_k} commit(s) refused by Kafka after the outside initialisation; "
            f"unset (lease) group: {count(sc_l, INITIALISED)} initialised, {refused_l} refused; "
            f"both committed to the log end ({ends_k}, {ends_l})"
        )

        # Live switch of the unset group to kafka: held leases keep lease fencing.
        mask = field_mask_pb2.FieldMask(paths=["commit_fencing"])
        updated = admin.UpdateGroup(
            admin_pb2.UpdateGroupRequest(
                group=group_config(group_l, topic_l, types_pb2.COMMIT_FENCING_KAFKA),
                update_mask=mask,
            ),
            timeout=30,
        )
        assert updated.group.commit_fencing == types_pb2.COMMIT_FENCING_KAFKA
        deadline = time.monotonic() + 30
        while count(sc_l, SWITCHED) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert count(sc_l, SWITCHED) == 1
        sc_l2 = mesh.sidecar(group_l, assigner, "sc-l2")
        sc_l2.wait_serving()
        after = wait_stable(assigner.grpc_addr, group_l, ["sc-l", "sc-l2"], PARTITIONS)
        produce(mesh.bootstrap, topic_l, ends_l)
        read_to_the_end(mesh, assigner.grpc_addr, group_l, topic_l, ends_l)
        kept = [p for p, lease in after.items() if lease.holder == "sc-l"]
        moved = [p for p, lease in after.items() if lease.holder == "sc-l2"]
        assert len(kept) == len(moved) == 1
        assert count(sc_l, INITIALISED) == 0, "the lease held at the switch kept lease fencing"
        assert count(sc_l2, INITIALISED) == 1, "the partition granted after it is Kafka-fenced"
        print(
            f"live switch to kafka: partition {kept} kept by sc-l (lease-fenced, 0 "
            f"producers), partition {moved} moved to sc-l2 (1 producer initialised); "
            f"committed to the log end {ends_l}"
        )

        # Back to lease, live: refused.
        with pytest.raises(grpc.RpcError) as refused:
            admin.UpdateGroup(
                admin_pb2.UpdateGroupRequest(
                    group=group_config(group_l, topic_l, types_pb2.COMMIT_FENCING_LEASE),
                    update_mask=mask,
                ),
                timeout=30,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "group.commit_fencing" in (refused.value.details() or "")
        print(f"switch back to lease: {refused.value.code().name}: {refused.value.details()}")
