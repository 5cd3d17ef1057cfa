"""Ack answers carried by batches (StreamOpen.answers_with_batches, issue 34): the answer to
an ``acks`` message that did not ask for it now rides on the stream's next batch
(StreamBatch.ack_results), or goes alone once it has waited ANSWER_HOLD_SECONDS; one that
asked for it now (``answer_now``) goes at once, after the held ones; answers keep the order
of the acks; a stream opened without the flag answers each ``acks`` on its own, as before.
Through the in-process server of stream_harness.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.consumer_sidecar import stream_flow
from services.consumer_sidecar.stream_flow import ANSWER_HOLD_SECONDS
from tests.unit.sidecar.stream_harness import Requests, Sidecar, acks_of, opening, run


def answering(records: int, fmt: int = stream_pb2.DELIVERY_FORMAT_UNSPECIFIED) -> Requests:
    request = opening(records=records, format=fmt)
    request.open.answers_with_batches = True
    return Requests(request)


def acks(records: list, *, now: bool = False) -> stream_pb2.StreamRequest:  # type: ignore[type-arg]
    return stream_pb2.StreamRequest(
        acks=stream_pb2.StreamAcks(acks=acks_of(records), answer_now=now)
    )


def test_an_answer_not_asked_for_now_rides_on_the_next_batch() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 3))
        requests = answering(records=100)
        call = stub.Stream(requests)
        first = await call.read()
        assert [r.offset for r in first.batch.records] == [0, 1, 2]
        requests.send(acks(list(first.batch.records)))
        await asyncio.sleep(ANSWER_HOLD_SECONDS / 4)  # committed, held for a batch
        sc.buffer(0, range(3, 5))
        second = await call.read()
        assert second.WhichOneof("kind") == "batch"
        assert [r.offset for r in second.batch.records] == [3, 4]
        assert [a.acked_count for a in second.batch.ack_results] == [3]
        assert part.acks.commit_point == 3
        call.cancel()

    run(body)


def test_a_held_answer_goes_alone_when_no_batch_comes() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 2))
        requests = answering(records=100)
        call = stub.Stream(requests)
        first = await call.read()
        requests.send(acks(list(first.batch.records)))
        loop = asyncio.get_running_loop()
        sent = loop.time()
        answer = await asyncio.wait_for(call.read(), timeout=5)
        waited = loop.time() - sent
        assert answer.WhichOneof("kind") == "ack_result"
        assert answer.ack_result.acked_count == 2
        # Held for a batch that never came, then sent (not before the hold: bounded below
        # only, never a wall-clock ceiling).
        assert waited >= ANSWER_HOLD_SECONDS * 0.9
        call.cancel()

    run(body)


def test_an_answer_asked_for_now_goes_at_once_after_the_held_ones_in_order() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 4))
        requests = answering(records=100)
        call = stub.Stream(requests)
        got = list((await call.read()).batch.records)
        requests.send(acks(got[:1]))  # held
        requests.send(acks(got[1:2]))  # held
        requests.send(acks(got[2:], now=True))  # flushes the held two first
        answers = [await call.read() for _ in range(3)]
        assert [a.WhichOneof("kind") for a in answers] == ["ack_result"] * 3
        assert [a.ack_result.acked_count for a in answers] == [1, 1, 2]
        assert part.acks.commit_point == 4
        call.cancel()

    run(body)


def test_without_the_flag_every_answer_is_its_own_message() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 2))
        requests = Requests(opening(records=100))
        call = stub.Stream(requests)
        first = await call.read()
        requests.send(acks(list(first.batch.records)))  # answer_now unset
        answer = await call.read()
        assert answer.WhichOneof("kind") == "ack_result" and answer.ack_result.acked_count == 2
        sc.buffer(0, range(2, 3))
        second = await call.read()
        assert second.WhichOneof("kind") == "batch" and not second.batch.ack_results
        call.cancel()

    run(body)


def test_held_answers_go_before_the_stream_ends() -> None:
    """The client half-closes with an answer held: it is sent, then the stream ends OK."""

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 2))
        requests = answering(records=100)
        call = stub.Stream(requests)
        first = await call.read()
        requests.send(acks(list(first.batch.records)))
        requests.send(None)
        answer = await call.read()
        assert answer.WhichOneof("kind") == "ack_result" and answer.ack_result.acked_count == 2
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK

    run(body)


def test_columns_batches_carry_the_answers_in_their_wire_bytes() -> None:
    """DELIVERY_FORMAT_BATCHES: the sidecar writes the batch's bytes itself
    (``wire.stream_response``); the answers are part of them, as protobuf reads them."""

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 2))
        requests = answering(records=100, fmt=stream_pb2.DELIVERY_FORMAT_BATCHES)
        call = stub.Stream(requests)
        first = await call.read()
        (run_,) = first.batch.batches
        span = stream_pb2.RangeAck(
            topic=run_.topic, partition=0, lease_epoch=1, from_offset=0, to_offset=2
        )
        requests.send(stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(ranges=[span])))
        await asyncio.sleep(ANSWER_HOLD_SECONDS / 4)
        sc.buffer(0, range(2, 3))
        second = await call.read()
        assert len(second.batch.batches) == 1
        assert [a.acked_count for a in second.batch.ack_results] == [1]
        call.cancel()

    run(body)


def test_a_stream_waiting_for_credit_does_not_hold_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No batch can go until the client grants credit, and that client may be waiting for
    these answers first (``ack_nowait``'s thread sends the next acks after them): the
    answer goes at once, not after the hold (made 30 s here, so only this can answer it)."""
    monkeypatch.setattr(stream_flow, "ANSWER_HOLD_SECONDS", 30.0)

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=1)
        sc.buffer(0, range(0, 4))
        requests = answering(records=2)  # the whole credit goes in the first batch
        call = stub.Stream(requests)
        first = await call.read()
        assert [r.offset for r in first.batch.records] == [0, 1]
        requests.send(acks(list(first.batch.records)))
        answer = await asyncio.wait_for(call.read(), timeout=10)
        assert answer.WhichOneof("kind") == "ack_result" and answer.ack_result.acked_count == 2
        call.cancel()

    run(body)


def test_acks_credit_and_a_held_answer_do_not_wake_a_stream_waiting_for_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34 (the per-batch cost): a stream waiting for records is not woken by an
    ``acks`` message or more credit (nothing it can send changes) nor by the answer it
    holds for the next batch (its wait is cut to the hold's deadline instead): between one
    batch and the next it looks for records once after sending and once when they come,
    not once more per message. Before, every ack, every credit and every first held answer
    cost a futile look (a take() and a new wait), three of the five per record."""
    monkeypatch.setattr(stream_flow, "ANSWER_HOLD_SECONDS", 30.0)

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=1)
        takes = 0
        take = sc.serving.take

        def counted(*args: object) -> object:
            nonlocal takes
            takes += 1
            return take(*args)  # type: ignore[arg-type]

        sc.serving.take = counted  # type: ignore[method-assign]
        sc.buffer(0, range(0, 2))
        requests = answering(records=100)
        call = stub.Stream(requests)
        first = await call.read()
        for record in first.batch.records:
            requests.send(acks([record]))  # two acks messages, two answers held
            requests.send(stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(records=1)))
        while part.acks.commit_point < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the answers are held: nothing more to look at
        before = takes
        sc.buffer(0, range(2, 3))
        second = await call.read()
        assert [r.offset for r in second.batch.records] == [2]
        assert [a.acked_count for a in second.batch.ack_results] == [1, 1]
        # Counted from the opening: the look that took the first batch, the empty one right
        # after it; then (after ``before``) the one that took record 2, and perhaps already
        # the empty one after that batch.
        assert before <= 2, f"{before} looks for records while only acks and credit came"
        assert takes - before in (1, 2)
        call.cancel()

    run(body)
