"""A Fetch with ``auto_ack`` acks only what a client can receive (issue 37, finding 8).

gRPC clients refuse a message above their maximum receive size (4 MiB by default in Go,
Java, Python and grpcurl) *after* the server sent it: the server sees the call end well
and auto_ack used to ack (and commit) records the client never got. Now the byte budget
counts the records' headers, an auto_ack response is kept within what every client
accepts, and a response that still exceeds it (one record larger than that) is not
acked: its records stay in flight, to be acked explicitly or delivered again.
On the real servicer over TCP (``stream_harness``), a client with gRPC's defaults.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2_grpc
from dsclient.records.batches import chunk_from_records
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import TOPIC, Sidecar, fetch_request, run

MIB = 1024 * 1024
Stub = stream_pb2_grpc.StreamServiceStub


def buffer(sc: Sidecar, records: list[common_pb2.Record]) -> None:
    """As the fetch thread does: append the records to partition 0, then notify."""
    sc.fetcher.log.setdefault(TP(TOPIC, 0), []).extend(records)
    assert sc.table.append(TP(TOPIC, 0), chunk_from_records(records))
    sc.data.notify()


def test_headers_count_in_the_byte_budget_and_auto_ack_acks_what_arrived() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        header = common_pb2.Header(key="trace", value=b"h" * (600 * 1024))
        buffer(
            sc,
            [
                common_pb2.Record(topic=TOPIC, offset=o, value=b"v", headers=[header])
                for o in range(10)
            ],
        )
        received: list[int] = []
        for _ in range(20):
            try:
                response = await stub.Fetch(fetch_request(auto_ack=True, max_bytes=MIB))
            except grpc.aio.AioRpcError as err:
                print("auto_ack Fetch of 10 x 600 KiB headers:", err.code().name, err.details())
                raise
            print("one auto_ack Fetch (1 MiB budget):", len(response.records), "records,",
                  response.ByteSize(), "bytes")  # fmt: skip
            assert response.ByteSize() <= MIB + 64 * 1024, "headers are in the budget"
            received += [r.offset for r in response.records]
            if len(received) == 10:
                break
        assert received == list(range(10)), "each record once, in order"
        for _ in range(200):
            if not part.acks.inflight:
                break
            await asyncio.sleep(0.01)
        await sc.keeper.commit_all()
        assert sc.fetcher.commits[-1].offset == 10

    run(body)


def test_a_response_larger_than_any_client_accepts_is_not_auto_acked() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        buffer(sc, [common_pb2.Record(topic=TOPIC, offset=0, value=b"x" * (5 * MIB))])
        try:
            await stub.Fetch(fetch_request(auto_ack=True, max_bytes=64 * MIB))
            raise AssertionError("a 5 MiB response reached a client limited to 4 MiB")
        except grpc.aio.AioRpcError as err:
            print("auto_ack Fetch of a 5 MiB record, client at 4 MiB:", err.code().name)
            assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        await asyncio.sleep(0.5)  # the server's end of the call has run its callbacks
        await sc.keeper.commit_all()
        print("after it: in flight", part.acks.inflight, "commits", sc.fetcher.commits)
        assert part.acks.inflight == 1, "not acked: in flight, to be delivered again"
        assert all(c.offset == 0 for c in sc.fetcher.commits), "offset 0 not committed past"

    run(body)
