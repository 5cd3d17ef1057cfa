"""A Stream's linger (StreamOpen.linger, issue 34): at low rates records arriving one by one
share a message (and so its credit, its ack and its commit) instead of one message each;
a whole batch buffered ends the wait. Through the in-process server of stream_harness.py."""

from __future__ import annotations

import asyncio

from google.protobuf import duration_pb2

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from tests.unit.sidecar.stream_harness import Requests, Sidecar, opening, run


def lingering(records: int, seconds: float) -> stream_pb2.StreamRequest:
    request = opening(records=records)
    request.open.linger.CopyFrom(duration_pb2.Duration(nanos=round(seconds * 1e9)))
    return request


def offsets(response: stream_pb2.StreamResponse) -> list[int]:
    assert response.WhichOneof("kind") == "batch", response
    return [r.offset for r in response.batch.records]


async def arriving_one_by_one(sc: Sidecar, first: int, count: int) -> None:
    """Records fetched one at a time, the stream free to run between them."""
    for offset in range(first, first + count):
        sc.buffer(0, range(offset, offset + 1))
        await asyncio.sleep(0.02)


def test_records_arriving_one_by_one_share_a_message_within_the_linger() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 1))
        call = stub.Stream(Requests(lingering(records=100, seconds=0.9)))
        assert offsets(await call.read()) == [0]  # the first record after a pause: at once
        await arriving_one_by_one(sc, 1, 3)
        assert offsets(await call.read()) == [1, 2, 3]  # one message, not three
        call.cancel()

    run(body)


def test_without_a_linger_records_go_out_as_they_come() -> None:
    """The same arrivals without a linger: more than one message (what the linger saves)."""

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 1))
        call = stub.Stream(Requests(opening(records=100)))
        assert offsets(await call.read()) == [0]
        await arriving_one_by_one(sc, 1, 3)
        got = offsets(await call.read())
        assert got[0] == 1 and len(got) < 3
        call.cancel()

    run(body)


def test_a_whole_batch_buffered_does_not_wait_for_the_linger() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 1))
        call = stub.Stream(Requests(lingering(records=4, seconds=1.0)))
        assert offsets(await call.read()) == [0]
        sc.buffer(0, range(1, 2))
        pending = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait([pending], timeout=0.3)
        assert not done  # one record, less than the 3 of credit left: it lingers
        sc.buffer(0, range(2, 4))  # now the whole credit is buffered
        assert offsets(await pending) == [1, 2, 3]
        call.cancel()

    run(body)


def test_holds_at_least_counts_records_and_bytes() -> None:
    sc = Sidecar()
    sc.hold(0, epoch=1)
    sc.hold(1, epoch=1)
    sc.buffer(0, range(0, 2))
    sc.buffer(1, range(0, 1))
    assert sc.table.holds_at_least(3, 1 << 20)
    assert not sc.table.holds_at_least(4, 1 << 20)
    assert sc.table.holds_at_least(4, 1)  # the bytes of a batch are there
