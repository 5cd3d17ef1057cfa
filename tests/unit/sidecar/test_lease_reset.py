"""A lease given up for an offset reset (a CONFIG revoke, no drain) on the real servicer,
keeper and table: what was in flight is dropped, and acks of it are refused as *stale* — in
the gap before the partition comes back under its new epoch as after it — so they never
move the commit point. A lease given up in a plain handoff answers "not held", as before.
"""

from __future__ import annotations

import grpc

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import (
    GROUP,
    TOPIC,
    Sidecar,
    fetch_request,
    range_ack,
    reason_of,
    run,
)

P = 0


def no_kafka_assignment(sidecar: Sidecar) -> None:
    sidecar.fetcher.unassign = lambda _tp: None  # type: ignore[attr-defined]


async def delivered(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
    sidecar.hold(P, epoch=3, start=100)
    sidecar.buffer(P, range(100, 110))
    response = await stub.Fetch(fetch_request(max_records=10))
    assert len(response.records) + sum(b.count for b in response.batches) == 10


def ack(lo: int, hi: int, epoch: int) -> stream_pb2.AckRequest:
    return stream_pb2.AckRequest(client_id="app", group=GROUP, ranges=[range_ack(P, lo, hi, epoch)])


def test_acks_from_before_a_reset_are_refused_as_stale_and_commit_nothing() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        no_kafka_assignment(sidecar)
        await delivered(stub, sidecar)
        await sidecar.keeper.revoke(TP(TOPIC, P), 3, 0.0, retire=True)
        assert sidecar.table.get(TP(TOPIC, P)) is None, "released at once: no drain"
        assert [(r.tp.partition, r.epoch) for r in sidecar.keeper.take_released()] == [(P, 3)]

        try:
            await stub.Ack(ack(100, 110, epoch=3))
        except grpc.aio.AioRpcError as err:
            code, reason, metadata = reason_of(err)
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EPOCH_STALE")
        assert metadata["epoch"] == "3"
        assert sidecar.fetcher.commits == [], "nothing acked, nothing committed"

        # Granted back under the reset's epoch: the old epoch stays stale.
        sidecar.hold(P, epoch=4, start=0)
        try:
            await stub.Ack(ack(100, 110, epoch=3))
        except grpc.aio.AioRpcError as err:
            code, reason, metadata = reason_of(err)
        assert (reason, metadata["current_epoch"]) == ("LEASE_EPOCH_STALE", "4")
        assert sidecar.fetcher.commits == []

    run(body)


def test_a_plain_handoff_still_answers_not_held() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        no_kafka_assignment(sidecar)
        await delivered(stub, sidecar)
        await sidecar.keeper.revoke(TP(TOPIC, P), 3, 0.0)
        response = await stub.Ack(ack(100, 110, epoch=3))
        assert [r.reason for r in response.rejected_ranges] == [stream_pb2.REJECT_REASON_NOT_HELD]

    run(body)
