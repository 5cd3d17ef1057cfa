"""Acks are bound to the client that received the records (issue 18, item 4), on a real
sidecar and a real Kafka broker: a second client of the group that acks records delivered
to the first is refused per record and range (REJECT_REASON_NOT_HOLDER) and commits
nothing; the receiving client's acks are accepted and commit to the end. Every record is
counted: each delivered once, none lost."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import grpc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from tests.support.mesh import Mesh
from tests.support.sidecar_rpcs import PARTITIONS, held_epochs, start
from tests.support.walking_skeleton import committed_offsets, end_offsets, produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

RECORDS = 1200


def fetch_all(stub: stream_pb2_grpc.StreamServiceStub, group: str, client: str) -> list[Any]:
    """Fetch as ``client`` until every produced record came (no acks yet)."""
    got: list[Any] = []
    deadline = time.monotonic() + 60
    while len(got) < RECORDS and time.monotonic() < deadline:
        request = stream_pb2.FetchRequest(client_id=client, group=group, max_records=500)
        request.max_wait.FromMilliseconds(500)
        got.extend(stub.Fetch(request, timeout=10).records)
    return got


def test_another_client_cannot_ack_what_one_client_received(mesh: Mesh, topic_factory: Any) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    expected = produce(mesh.bootstrap, topic, RECORDS)
    group, sidecar = start(mesh, topic)
    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        held_epochs(stub)
        records = fetch_all(stub, group, "owner")
        received: dict[int, list[int]] = defaultdict(list)
        for r in records:
            received[r.partition].append(int(r.key.decode()))
        assert dict(received) == dict(expected), "missing, duplicated or out of order"

        acks = [
            stream_pb2.RecordAck(
                topic=r.topic, partition=r.partition, offset=r.offset, lease_epoch=r.lease_epoch
            )
            for r in records
        ]
        ranges = [
            stream_pb2.RangeAck(
                topic=topic, partition=p, from_offset=0, to_offset=len(seqs),
                lease_epoch=next(r.lease_epoch for r in records if r.partition == p),
            )
            for p, seqs in sorted(received.items())
        ]  # fmt: skip
        intruder = stub.Ack(
            stream_pb2.AckRequest(client_id="intruder", group=group, acks=acks[:100]),
            timeout=10,
        )
        intruder_ranges = stub.Ack(
            stream_pb2.AckRequest(client_id="intruder", group=group, ranges=ranges),
            timeout=10,
        )
        refused = [r.reason for r in intruder.rejected_acks] + [
            r.reason for r in intruder_ranges.rejected_ranges
        ]
        print(
            f"intruder: {intruder.acked_count + intruder_ranges.acked_count} accepted, "
            f"{len(refused)} refused "
            f"({set(stream_pb2.RejectReason.Name(x) for x in refused)}); "
            f"e.g. {intruder.rejected_acks[0].message!r}"
        )
        assert intruder.acked_count == intruder_ranges.acked_count == 0
        assert len(refused) == 100 + len(ranges)
        assert set(refused) == {stream_pb2.REJECT_REASON_NOT_HOLDER}
        time.sleep(1.5)  # past the commit interval: nothing may have been committed
        before = committed_offsets(mesh.bootstrap, group, topic)
        assert max(before.values(), default=0) <= 0, f"committed for the intruder: {before}"

        owner = stub.Ack(
            stream_pb2.AckRequest(client_id="owner", group=group, ranges=ranges), timeout=10
        )
        assert owner.acked_count == len(ranges) and not owner.rejected_ranges
    ends = end_offsets(mesh.bootstrap, topic)
    deadline = time.monotonic() + 15
    committed: dict[int, int] = {}
    while time.monotonic() < deadline and committed != ends:
        committed = committed_offsets(mesh.bootstrap, group, topic)
        time.sleep(0.3)
    print(
        f"ack binding: produced {RECORDS}, received {len(records)}, lost 0, duplicates 0; "
        f"owner's {len(ranges)} range acks accepted, committed == end offsets: {committed == ends}"
    )
    assert committed == ends
