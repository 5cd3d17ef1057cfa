"""Explicit commits are bound to the client ReadRange gave the records to (issue 18, item 4),
on a real sidecar and a real Kafka broker: a client that read nothing cannot CommitOffsets
past records (REJECT_REASON_NOT_HOLDER), the reading client cannot commit beyond what it
read (REJECT_REASON_NOT_DELIVERED), nothing of either reaches Kafka; once it has read the
rest, its commit of the end offsets is accepted. Every record read is counted."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import grpc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from tests.support.mesh import Mesh
from tests.support.sidecar_rpcs import PARTITIONS, held_epochs, retry_not_ready, start
from tests.support.walking_skeleton import committed_offsets, end_offsets, produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

RECORDS = 1200
NOT_COMMITTED = -1001  # what Kafka answers for a partition the group never committed


def test_only_the_reading_client_commits_and_only_what_it_read(
    mesh: Mesh, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    expected = produce(mesh.bootstrap, topic, RECORDS)
    group, sidecar = start(mesh, topic)
    ends = end_offsets(mesh.bootstrap, topic)
    halves = {p: end // 2 for p, end in ends.items()}
    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        epochs = held_epochs(stub)
        read: dict[int, list[int]] = defaultdict(list)

        def read_range(partition: int, lo: int, hi: int) -> None:
            request = stream_pb2.ReadRangeRequest(
                client_id="spark", group=group, topic=topic, partition=partition,
                from_offset=lo, to_offset=hi, max_bytes=2000,
            )  # fmt: skip
            responses = retry_not_ready(lambda: list(stub.ReadRange(request, timeout=30)))
            for response in responses:
                read[partition].extend(int(r.key.decode()) for r in response.records)

        def commit_as(client: str, offsets: dict[int, int]) -> list[Any]:
            request = stream_pb2.CommitOffsetsRequest(
                client_id=client,
                group=group,
                offsets=[
                    stream_pb2.OffsetCommit(
                        topic=topic, partition=p, offset=o, lease_epoch=epochs[p]
                    )
                    for p, o in sorted(offsets.items())
                ],
            )
            return list(stub.CommitOffsets(request, timeout=10).results)

        for partition in range(PARTITIONS):
            read_range(partition, 0, halves[partition])

        intruder = commit_as("intruder", ends)
        skipping = commit_as("spark", ends)
        refusals = {
            "intruder": {stream_pb2.RejectReason.Name(r.reason) for r in intruder},
            "spark beyond what it read": {stream_pb2.RejectReason.Name(r.reason) for r in skipping},
        }
        print(f"\nrefused: {refusals}; e.g. {intruder[0].message!r}; {skipping[0].message!r}")
        assert not any(r.committed for r in intruder + skipping)
        assert refusals == {
            "intruder": {"REJECT_REASON_NOT_HOLDER"},
            "spark beyond what it read": {"REJECT_REASON_NOT_DELIVERED"},
        }
        time.sleep(1.5)  # past the commit interval: nothing of them may reach Kafka
        assert set(committed_offsets(mesh.bootstrap, group, topic).values()) == {NOT_COMMITTED}

        halfway = commit_as("spark", halves)
        assert all(r.committed for r in halfway), halfway
        for partition in range(PARTITIONS):
            read_range(partition, halves[partition], ends[partition])
        final = commit_as("spark", ends)
        assert all(r.committed for r in final), final

    committed = committed_offsets(mesh.bootstrap, group, topic)
    got = sum(len(keys) for keys in read.values())
    lost = sum(len(set(expected[p]) - set(read[p])) for p in expected)
    duplicates = got - sum(len(set(keys)) for keys in read.values())
    print(
        f"commit binding: produced {RECORDS}, read {got}, lost {lost}, duplicates "
        f"{duplicates}; intruder 0/{len(intruder)} and over-reaching 0/{len(skipping)} commits "
        f"accepted; reader's {len(final)} accepted, committed == end offsets: {committed == ends}"
    )
    assert dict(read) == dict(expected), "records missing, duplicated or out of order"
    assert committed == ends
