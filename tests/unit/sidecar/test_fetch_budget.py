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
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.records.batches import chunk_from_records
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import (
    TOPIC,
    Requests,
    Sidecar,
    fetch_request,
    opening,
    run,
)

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
        await sc.keeper.committer.commit_all()
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
        await sc.keeper.committer.commit_all()
        print("after it: in flight", part.acks.inflight, "commits", sc.fetcher.commits)
        assert part.acks.inflight == 1, "not acked: in flight, to be delivered again"
        assert all(c.offset == 0 for c in sc.fetcher.commits), "offset 0 not committed past"

    run(body)


def test_a_stream_message_larger_than_any_client_accepts_is_not_auto_acked() -> None:
    """The same exposure on Stream: an auto_ack stream whose flow-control window has grown
    (20 records of 900 KiB read first) and whose byte credit allows a 4.5 MiB record
    wrote that record's message whole; the client refused it (RESOURCE_EXHAUSTED, the
    stream ended on its side), and the sidecar counted it acked and committed past it
    (red: commit point 21 with 20 received). Now such a message is not acked: the record
    comes again when the stream ends."""

    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        warm = [
            common_pb2.Record(topic=TOPIC, offset=o, value=b"w" * (900 * 1024)) for o in range(20)
        ]
        big = common_pb2.Record(topic=TOPIC, offset=20, value=b"x" * (9 * MIB // 2))
        buffer(sc, [*warm, big])
        call = stub.Stream(Requests(opening(records=1000, nbytes=1024 * MIB, auto_ack=True)))
        received: list[int] = []
        try:
            while True:
                response = await call.read()
                received += [r.offset for r in response.batch.records]
        except grpc.aio.AioRpcError as err:
            print("auto_ack Stream, a 4.5 MiB record, client at 4 MiB:", err.code().name)
            assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert received == list(range(20))
        await asyncio.sleep(0.5)  # the server's end of the stream has run
        await sc.keeper.committer.commit_all()
        print("received", len(received), "commit point", part.acks.commit_point,
              "commits", [c.offset for c in sc.fetcher.commits][-1:])  # fmt: skip
        assert part.acks.commit_point == 20, "the refused record is not acked"
        assert all(c.offset <= 20 for c in sc.fetcher.commits), "offset 20 not committed past"

    run(body)


def test_an_auto_ack_stream_message_is_kept_within_what_clients_accept() -> None:
    """Headers count in a Stream's budget as in Fetch's, and an auto_ack stream's message
    is kept within what every client accepts in both forms (Record messages: 1 MiB; the
    RecordBatch columns, 4 MiB otherwise: 3.75 MiB with auto_ack): 10 records of 700 KiB
    headers with ample byte credit come in messages every client accepts, each acked
    once written."""

    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        header = common_pb2.Header(key="trace", value=b"h" * (700 * 1024))
        records = [
            common_pb2.Record(topic=TOPIC, offset=o, value=b"v", headers=[header])
            for o in range(10)
        ]
        buffer(sc, records)
        opened = opening(
            records=100, nbytes=64 * MIB, auto_ack=True,
            format=stream_pb2.DELIVERY_FORMAT_BATCHES,
        )  # fmt: skip
        call = stub.Stream(Requests(opened))
        received = 0
        while received < 10:
            response = await call.read()
            size = response.ByteSize()
            count = sum(len(b.offsets) // 8 for b in response.batch.batches)
            print("one auto_ack Stream message (columns):", count, "records,", size, "bytes")
            assert size <= 4 * MIB, "every client accepts it"
            received += count
        call.cancel()
        for _ in range(200):
            if part.acks.commit_point == 10:
                break
            await asyncio.sleep(0.01)
        assert part.acks.commit_point == 10

    run(body)
