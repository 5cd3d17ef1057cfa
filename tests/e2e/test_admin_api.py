"""AdminService on the real mesh (issue: Assigner, item 8).

An assigner and two sidecars on a real Kafka broker: DescribeGroup's committed and end
offsets and lag per partition equal what Kafka itself reports; MoveLease hands a
partition to the other sidecar (new holder, higher epoch) and consumption goes on; bad
requests get the right status code and ErrorInfo reason.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest
from confluent_kafka import Consumer, TopicPartition
from google.protobuf import field_mask_pb2

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dsclient import DsClient
from dsclient.reasons import DsError, Reason, error_info
from services.assigner.kafka_offsets import KafkaOffsets
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP
from tests.support.mesh import Mesh
from tests.support.offsets import committed_offsets
from tests.support.producing import produce
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PARTITIONS = 4
RECORDS = 400
CONSUME_FIRST = 150


def kafka_offsets(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (committed or -1, end offset), read directly from Kafka."""
    committed = {
        p: max(offset, -1)
        for p, offset in committed_offsets(bootstrap, group, topic, PARTITIONS).items()
    }
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ds-test-watermarks"})
    try:
        return {
            p: (
                committed[p],
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1],
            )
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def settled_kafka_offsets(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """Kafka's view once the sidecars' commits of our acks have landed (two equal reads)."""
    previous = kafka_offsets(bootstrap, group, topic)
    for _ in range(30):
        time.sleep(1.0)
        current = kafka_offsets(bootstrap, group, topic)
        if current == previous and sum(c for c, _ in current.values() if c > 0) > 0:
            return current
        previous = current
    raise AssertionError(f"committed offsets never settled: {previous}")


def code_and_reason(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as excinfo:
        call()
    err = excinfo.value
    info = error_info(err)
    return err.code(), info.reason if info is not None else ""  # type: ignore[attr-defined]


@pytest.fixture
def admin_stub(mesh: Mesh, topic_factory: object) -> Iterator[tuple[Mesh, str, str, object]]:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"[:249]
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    with grpc.insecure_channel(assigner.grpc_addr) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)

        def serving_groups() -> bool:
            # Healthy is not yet leading: groups are served once the state is rebuilt.
            try:
                stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=5)
            except grpc.RpcError as err:
                print("DescribeGroup:", err.code(), err.details(), assigner.proc.poll())  # type: ignore[attr-defined,union-attr]
                return False
            return True

        # On a fresh broker the first group-offsets read waits for __consumer_offsets to be
        # created (50 partitions): give it time on a loaded 2-core machine.
        wait_for(serving_groups, 90, "the assigner serves its configured group")
        yield mesh, topic, group, (assigner, stub)


def test_describe_move_and_consume(admin_stub: tuple[Mesh, str, str, object]) -> None:
    mesh, topic, group, (assigner, stub) = admin_stub  # type: ignore[misc]
    produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS)
    for sidecar_id in ("sidecar-a", "sidecar-b"):
        mesh.sidecar(group, assigner, sidecar_id).wait_serving()

    def describe() -> admin_pb2.DescribeGroupResponse:
        return stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=20)

    wait_for(
        lambda: len(describe().members) == 2 and all(lease.holder for lease in describe().leases),
        30,
        "both sidecars joined and every partition leased",
    )
    # A mode switch with sidecars attached is a live switch now (tests/e2e/test_mode_switch.py);
    # one naming a config version that is not the group's is refused before anything moves.
    with pytest.raises(grpc.RpcError) as refused:
        stub.UpdateGroup(
            admin_pb2.UpdateGroupRequest(
                group=types_pb2.GroupConfig(name=group, mode=common_pb2.GROUP_MODE_KAFKA_GROUP),
                update_mask=field_mask_pb2.FieldMask(paths=["mode"]),
                expected_config_version=99,
            ),
            timeout=20,
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(refused.value)
    assert info is not None and info.reason == "CONFIG_VERSION_CONFLICT"
    assert describe().config.mode == common_pb2.GROUP_MODE_LEASED

    seen: set[tuple[int, int]] = set()
    with DsClient(group, client_id="admin-e2e", assigner=assigner.grpc_addr) as client:
        deadline = time.monotonic() + 60
        while len(seen) < CONSUME_FIRST and time.monotonic() < deadline:
            batch = client.fetch(max_records=50, max_wait=1.0)
            seen.update((r.partition, r.offset) for r in batch)
            if batch:
                assert client.ack(batch) == len(batch)
        assert len(seen) >= CONSUME_FIRST

        # DescribeGroup's offsets are Kafka's offsets.
        expected = settled_kafka_offsets(mesh.bootstrap, group, topic)
        # lag_seconds comes from a probe that may still be running (-1 until it answered).
        wait_for(
            lambda: all(p.lag_seconds >= 0 for p in describe().partitions),
            10,
            "lag_seconds known for every partition",
        )
        response = describe()
        got = {p.partition: (p.committed_offset, p.end_offset) for p in response.partitions}
        assert got == expected
        assert sum(end for _, end in expected.values()) == RECORDS
        for p in response.partitions:
            start = p.committed_offset if p.committed_offset >= 0 else 0
            assert p.lag_records == p.end_offset - start
            if p.lag_records > 0:
                assert p.lag_seconds > 0, f"lag_seconds unknown for partition {p.partition}"
            else:
                assert p.lag_seconds == 0
        assert sum(p.lag_records for p in response.partitions) > 0
        assert response.config.config_version >= 1
        assert {m.sidecar_id for m in response.members} == {"sidecar-a", "sidecar-b"}
        for m in response.members:
            assert m.endpoint and m.last_heartbeat.seconds > time.time() - 30
        assert [b.client_id for b in response.bindings] == ["admin-e2e"]

        listed = stub.ListGroups(admin_pb2.ListGroupsRequest(), timeout=20)
        summary = next(g for g in listed.groups if g.config.name == group)
        assert summary.total_lag == sum(p.lag_records for p in response.partitions)
        assert (summary.member_count, summary.partition_count) == (2, PARTITIONS)

        # MoveLease: a partition of sidecar-a goes to sidecar-b, with a higher epoch.
        lease = next(lease for lease in response.leases if lease.holder == "sidecar-a")
        request_id = str(uuid.uuid4())
        move = admin_pb2.MoveLeaseRequest(
            group=group,
            topic=topic,
            partition=lease.partition,
            target_sidecar_id="sidecar-b",
            request_id=request_id,
        )
        moved = stub.MoveLease(move, timeout=20)
        assert moved.lease.partition == lease.partition
        assert moved.lease.state in (types_pb2.LEASE_STATE_REVOKING, types_pb2.LEASE_STATE_GRANTED)
        # A retry returns the first answer; the request_id with another body is refused.
        assert stub.MoveLease(move, timeout=20) == moved
        other = admin_pb2.MoveLeaseRequest()
        other.CopyFrom(move)
        other.target_sidecar_id = "sidecar-a"
        assert code_and_reason(lambda: stub.MoveLease(other, timeout=20)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
        )

        def moved_to_b() -> bool:
            now = next(x for x in describe().leases if x.partition == lease.partition)
            return (
                now.holder == "sidecar-b"
                and now.epoch > lease.epoch
                and now.state in (types_pb2.LEASE_STATE_GRANTED, types_pb2.LEASE_STATE_ACTIVE)
            )

        wait_for(moved_to_b, 15, f"partition {lease.partition} held by sidecar-b")

        # Consumption goes on, including the moved partition: every record arrives.
        deadline = time.monotonic() + 90
        while len(seen) < RECORDS and time.monotonic() < deadline:
            batch = client.fetch(max_records=100, max_wait=1.0)
            seen.update((r.partition, r.offset) for r in batch)
            if batch:
                client.ack(batch)
        assert len(seen) == RECORDS, f"{RECORDS - len(seen)} records never delivered"

    # Moving it to where it already is changes nothing.
    held = next(x for x in describe().leases if x.partition == lease.partition)
    again = stub.MoveLease(
        admin_pb2.MoveLeaseRequest(
            group=group, topic=topic, partition=lease.partition, target_sidecar_id="sidecar-b"
        ),
        timeout=20,
    )
    assert (again.lease.holder, again.lease.epoch) == ("sidecar-b", held.epoch)


def test_bad_requests_get_the_right_codes(admin_stub: tuple[Mesh, str, str, object]) -> None:
    _, topic, group, (_, stub) = admin_stub  # type: ignore[misc]
    invalid = (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    not_found = grpc.StatusCode.NOT_FOUND
    unknown_group = "no-such-group"

    assert code_and_reason(lambda: stub.DescribeGroup(admin_pb2.DescribeGroupRequest())) == invalid
    assert code_and_reason(
        lambda: stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=unknown_group))
    ) == (not_found, "GROUP_NOT_FOUND")
    assert (
        code_and_reason(lambda: stub.ListGroups(admin_pb2.ListGroupsRequest(page_size=-1)))
        == invalid
    )
    assert (
        code_and_reason(lambda: stub.ListGroups(admin_pb2.ListGroupsRequest(page_token="forged")))
        == invalid
    )

    def create(request_id: str = "", **kwargs: object) -> admin_pb2.CreateGroupResponse:
        fields: dict[str, object] = {
            "name": f"{group}-2",
            "topics": [topic],
            "mode": common_pb2.GROUP_MODE_LEASED,
        }
        fields.update(kwargs)
        cfg = types_pb2.GroupConfig(**fields)  # type: ignore[arg-type]
        return stub.CreateGroup(  # type: ignore[no-any-return]
            admin_pb2.CreateGroupRequest(group=cfg, request_id=request_id), timeout=20
        )

    assert code_and_reason(lambda: create(name="bad name")) == invalid
    assert code_and_reason(lambda: create(topics=[])) == invalid
    assert code_and_reason(lambda: create(mode=common_pb2.GROUP_MODE_UNSPECIFIED)) == invalid
    assert code_and_reason(lambda: create(topics=["no-such-topic-x"])) == (
        not_found,
        "TOPIC_NOT_FOUND",
    )
    with pytest.raises(grpc.RpcError) as excinfo:
        create(consumer_config={"enable.auto.commit": "true"})
    info = error_info(excinfo.value)
    assert info is not None and info.metadata["key"] == "enable.auto.commit"
    assert code_and_reason(lambda: create(consumer_config={"no.such.prop": "1"})) == invalid

    # Idempotent creation: the same request_id and body answer the same; another body not.
    request_id = str(uuid.uuid4())
    first = create(request_id)
    assert first.group.config_version == 1
    assert create(request_id) == first
    assert (
        code_and_reason(lambda: create(request_id, consumer_config={"fetch.wait.max.ms": "100"}))
        == invalid
    )
    assert code_and_reason(lambda: create(consumer_config={"fetch.wait.max.ms": "100"})) == (
        grpc.StatusCode.ALREADY_EXISTS,
        "GROUP_ALREADY_EXISTS",
    )

    # UpdateGroup: masks, optimistic concurrency, versions, mode switch.
    def update(
        paths: list[str], expected: int = 0, request_id: str = "", **kwargs: object
    ) -> admin_pb2.UpdateGroupResponse:
        cfg = types_pb2.GroupConfig(name=f"{group}-2", **kwargs)  # type: ignore[arg-type]
        return stub.UpdateGroup(  # type: ignore[no-any-return]
            admin_pb2.UpdateGroupRequest(
                group=cfg,
                update_mask=field_mask_pb2.FieldMask(paths=paths),
                expected_config_version=expected,
                request_id=request_id,
            ),
            timeout=20,
        )

    assert code_and_reason(lambda: update(["name"])) == invalid
    assert code_and_reason(lambda: update(["bogus"])) == invalid
    assert (
        code_and_reason(lambda: update(["consumer_config"], consumer_config={"group.id": "x"}))
        == invalid
    )
    update_id = str(uuid.uuid4())
    updated = update(
        ["consumer_config"], 1, update_id, consumer_config={"fetch.wait.max.ms": "200"}
    )
    assert updated.group.config_version == 2
    assert dict(updated.group.consumer_config) == {"fetch.wait.max.ms": "200"}
    assert list(updated.group.topics) == [topic]  # not in the mask: unchanged
    # A retry of that update is answered, not applied again (the version stays 2).
    assert (
        update(["consumer_config"], 1, update_id, consumer_config={"fetch.wait.max.ms": "200"})
        == updated
    )
    assert code_and_reason(
        lambda: update(["consumer_config"], 1, consumer_config={"fetch.wait.max.ms": "300"})
    ) == (grpc.StatusCode.FAILED_PRECONDITION, "CONFIG_VERSION_CONFLICT")
    # No sidecar is attached and the Kafka group is empty: a mode switch is allowed (and
    # switched back). With sidecars attached it is refused (test_describe_move_and_consume
    # covers the running case).
    switched = update(["mode"], mode=common_pb2.GROUP_MODE_KAFKA_GROUP)
    assert switched.group.mode == common_pb2.GROUP_MODE_KAFKA_GROUP
    back = update(["mode"], mode=common_pb2.GROUP_MODE_LEASED)
    assert back.group.mode == common_pb2.GROUP_MODE_LEASED
    assert code_and_reason(lambda: update(["topics"], topics=[topic, "no-such-topic-y"])) == (
        not_found,
        "TOPIC_NOT_FOUND",
    )
    assert code_and_reason(
        lambda: stub.UpdateGroup(
            admin_pb2.UpdateGroupRequest(group=types_pb2.GroupConfig(name=unknown_group))
        )
    ) == (not_found, "GROUP_NOT_FOUND")

    # MoveLease validation.
    def move_lease(**kwargs: object) -> admin_pb2.MoveLeaseResponse:
        fields: dict[str, object] = {
            "group": group,
            "topic": topic,
            "partition": 0,
            "target_sidecar_id": "nobody",
        }
        fields.update(kwargs)
        return stub.MoveLease(  # type: ignore[no-any-return]
            admin_pb2.MoveLeaseRequest(**fields),
            timeout=20,  # type: ignore[arg-type]
        )

    assert code_and_reason(lambda: move_lease(partition=-1)) == invalid
    assert code_and_reason(lambda: move_lease(topic="")) == invalid
    assert code_and_reason(lambda: move_lease(partition=PARTITIONS)) == (
        not_found,
        "TOPIC_NOT_FOUND",
    )
    assert code_and_reason(lambda: move_lease()) == (not_found, "SIDECAR_NOT_FOUND")
    assert code_and_reason(lambda: move_lease(group=unknown_group)) == (
        not_found,
        "GROUP_NOT_FOUND",
    )

    # ResetOffsets is implemented (tests/e2e/test_offsets_reset.py): no strategy is bad input.
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.ResetOffsets(admin_pb2.ResetOffsetsRequest(group=group), timeout=20)
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]

    # Paging over the two groups, one per page, with the token we issued.
    page1 = stub.ListGroups(admin_pb2.ListGroupsRequest(page_size=1), timeout=20)
    assert len(page1.groups) == 1 and page1.next_page_token
    page2 = stub.ListGroups(
        admin_pb2.ListGroupsRequest(page_size=1, page_token=page1.next_page_token), timeout=20
    )
    assert [g.config.name for g in (*page1.groups, *page2.groups)] == [group, f"{group}-2"]
    assert page2.next_page_token == ""
    # Nothing was produced to this test's topic: no lag.
    assert page1.groups[0].total_lag == 0


def test_unreachable_kafka_is_unavailable_not_a_hang() -> None:
    """Offsets are read with a deadline: no broker answers -> KAFKA_UNAVAILABLE in time."""
    settings = ServiceSettings(bootstrap="127.0.0.1:1", grpc_port=0, http_port=0)
    offsets = KafkaOffsets(settings, timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(DsError) as excinfo:
            offsets.read("g", [TP("t", 0)])
        assert excinfo.value.reason is Reason.KAFKA_UNAVAILABLE
        assert excinfo.value.code is grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 10
        many = offsets.read_many({"g": [TP("t", 0)], "empty": []})
        assert isinstance(many["g"], DsError) and many["empty"] == {}
    finally:
        # Its consumers (no AdminClient futures any more) close synchronously; left open they
        # would log their failed connections to the test run's stderr until it ends.
        offsets.close()
