"""Redelivery through the StreamService servicer, in-process (ARCHITECTURE §3 "Delivery").

The real servicer over a real Serving, PartitionTable and LeaseKeeper (``stream_harness``);
the fetch thread's Kafka side is faked and re-reads what the test buffered on a rewind. A
delivered record that is not acked comes again — with its delivery count one higher — when
its stream ends, when its client nacks it (now or after a delay), when its Fetch response
never reached the client, or when its ack deadline passes; past the delivery limit it is
given up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.records.batches import decode_batch
from services.consumer_sidecar.acks import GivenUp
from services.consumer_sidecar.events import LeaseEvents, RedeliveryEvents
from services.consumer_sidecar.partitions import Redelivery
from services.consumer_sidecar.rpc import StreamServicer
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import (
    GROUP,
    TOPIC,
    Requests,
    Sidecar,
    fetch_request,
    opening,
    range_ack,
    run,
)

Stub = stream_pb2_grpc.StreamServiceStub


async def fetch_until(
    stub: Stub, count: int, client_id: str, timeout: float = 5.0
) -> list[tuple[int, int]]:
    """(offset, delivery count) of what ``client_id`` fetches until ``count`` arrived."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        response = await stub.Fetch(fetch_request(wait_ms=100, client_id=client_id))
        got += [(r.offset, r.delivery_count) for r in response.records]
    return got


def nack(client_id: str, *ranges: stream_pb2.RangeAck, **fields: Any) -> stream_pb2.NackRequest:
    return stream_pb2.NackRequest(client_id=client_id, group=GROUP, ranges=ranges, **fields)


def test_what_a_stream_delivered_and_did_not_ack_comes_again_when_it_ends() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=1)
        sc.buffer(0, range(10))
        requests = Requests(opening(records=10, client_id="app-1"))
        call = stub.Stream(requests)
        got: list[int] = []
        while len(got) < 10:
            got += [r.offset for r in (await call.read()).batch.records]
        requests.send(
            stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(ranges=[range_ack(0, 0, 5, 1)]))
        )
        assert (await call.read()).ack_result.acked_count == 1
        call.cancel()  # the application's stream goes away with 5..9 un-acked
        again = await fetch_until(stub, 5, "app-2")
        assert again == [(o, 2) for o in range(5, 10)]
        assert part.acks.commit_point == 5 and part.acks.inflight == 5 and part.acks.due == 0

    run(body)


def test_nacks_give_back_the_callers_records_now_or_after_a_delay() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=1)
        sc.buffer(0, range(10))
        first = await stub.Fetch(fetch_request(client_id="a", max_records=5))
        second = await stub.Fetch(fetch_request(client_id="b", max_records=5))
        assert [r.offset for r in first.records] == [0, 1, 2, 3, 4]
        assert [r.offset for r in second.records] == [5, 6, 7, 8, 9]
        # "a" nacks the whole range: only its own five records come again, not b's.
        answer = await stub.Nack(nack("a", range_ack(0, 0, 10, 1)))
        assert (answer.nacked_count, answer.records) == (1, 5) and not answer.rejected_ranges
        assert await fetch_until(stub, 5, "c") == [(o, 2) for o in range(5)]
        # A stale epoch is refused; a nack with a delay keeps the records in flight until then.
        stale = await stub.Nack(nack("c", range_ack(0, 0, 5, 9)))
        assert [r.reason for r in stale.rejected_ranges] == [stream_pb2.REJECT_REASON_STALE_EPOCH]
        delayed = nack("c", range_ack(0, 0, 5, 1))
        delayed.delay.FromMilliseconds(400)
        assert (await stub.Nack(delayed)).records == 5
        sc.keeper.redeliverer.expire_deliveries()
        assert await fetch_until(stub, 1, "d", timeout=0.3) == []
        await asyncio.sleep(0.45)
        sc.keeper.redeliverer.expire_deliveries()  # the redelivery loop's round
        assert await fetch_until(stub, 5, "d") == [(o, 3) for o in range(5)]
        # "all": everything b has in flight here.
        everything = await stub.Nack(stream_pb2.NackRequest(client_id="b", group=GROUP, all=True))
        assert (everything.nacked_count, everything.records) == (1, 5)
        assert await fetch_until(stub, 5, "e") == [(o, 2) for o in range(5, 10)]
        assert part.acks.commit_point == 0

    run(body)


def test_stream_nacks_are_answered_and_the_records_come_again_with_their_count() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0, epoch=2)
        sc.buffer(0, range(4))
        opened = opening(records=100, client_id="app")
        opened.open.format = stream_pb2.DELIVERY_FORMAT_BATCHES
        requests = Requests(opened)
        call = stub.Stream(requests)
        (batch,) = (await call.read()).batch.batches
        assert ([r.offset for r in decode_batch(batch)], batch.delivery_count) == ([0, 1, 2, 3], 1)
        nacks = stream_pb2.StreamNacks(ranges=[range_ack(0, 2, 4, 2)])
        requests.send(stream_pb2.StreamRequest(nacks=nacks))
        result = (await call.read()).nack_result
        assert (result.nacked_count, result.records) == (1, 2)
        (batch,) = (await call.read()).batch.batches
        records = decode_batch(batch)
        assert [(r.offset, r.delivery_count) for r in records] == [(2, 2), (3, 2)]
        assert batch.delivery_count == 2
        call.cancel()

    run(body)


class UnsentFetch(StreamServicer):
    """A Fetch whose response is held back past the client's deadline (a slow network, a
    client that gave up): the call ends cancelled, its response never written."""

    async def Fetch(self, request: Any, context: Any) -> Any:  # type: ignore[override]
        response = await super().Fetch(request, context)
        if request.client_id == "gives-up":
            await asyncio.sleep(2)
        return response


def test_records_of_a_fetch_response_that_never_reached_the_client_come_again() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=1)
        sc.buffer(0, range(3))
        for auto_ack in (False, True):
            try:
                await stub.Fetch(
                    fetch_request(client_id="gives-up", auto_ack=auto_ack), timeout=0.3
                )
                raise AssertionError("the call was expected to time out")
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            expected = 2 if not auto_ack else 4  # gives-up, patient, gives-up, patient
            got: list[tuple[int, int]] = []
            deadline = time.monotonic() + 5
            while len(got) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                got = await fetch_until(stub, 3, "patient", timeout=0.3)
            assert got == [(o, expected) for o in range(3)], (auto_ack, got)
            await stub.Nack(nack("patient", range_ack(0, 0, 3, 1)))  # for the next round
        assert part.acks.commit_point == 0, "nothing the client did not get is acked"

    run(body, servicer_class=UnsentFetch)


def test_records_past_their_ack_deadline_come_again_then_are_given_up() -> None:
    given_up: list[tuple[TP, int, GivenUp]] = []

    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=1)
        sc.table.redelivery = Redelivery(visibility=0.2, max_deliveries=2)
        sc.buffer(0, range(3))
        assert await fetch_until(stub, 3, "slow") == [(0, 1), (1, 1), (2, 1)]
        await asyncio.sleep(0.25)
        sc.keeper.redeliverer.expire_deliveries()
        assert await fetch_until(stub, 3, "slow") == [(0, 2), (1, 2), (2, 2)]
        status = await stub.Status(stream_pb2.StatusRequest())
        assert status.max_deliveries == 2
        assert status.visibility_timeout.ToMilliseconds() == 200
        await asyncio.sleep(0.25)
        sc.keeper.redeliverer.expire_deliveries()
        assert [(tp, e, g.lo, g.hi, g.deliveries) for tp, e, g in given_up] == [
            (TP(TOPIC, 0), 1, 0, 3, 2)
        ]
        assert part.acks.commit_point == 3, "the commit point passes what was given up"
        assert await fetch_until(stub, 1, "slow", timeout=0.3) == []

    run(
        body,
        events=LeaseEvents(
            redelivery=RedeliveryEvents(
                on_given_up=lambda tp, epoch, g: given_up.append((tp, epoch, g))
            )
        ),
    )


def test_status_counts_records_in_flight_and_due() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(4))
        await stub.Fetch(fetch_request(client_id="a"))
        part = sc.table.get(TP(TOPIC, 0))
        assert part is not None
        part.rewinding = True  # hold the re-read back: the records stay due
        sc.table.nack(part, 0, 2, "a", 0.0)
        (status,) = (await stub.Status(stream_pb2.StatusRequest())).partitions
        assert (status.inflight, status.due) == (2, 2)

    run(body)
