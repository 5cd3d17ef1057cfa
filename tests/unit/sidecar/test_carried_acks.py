"""The answers to acks carried by Fetch requests wait per client for a response to take them
(services/consumer_sidecar/carried_acks.py): each answer once, those still committing kept,
old ones dropped."""

from __future__ import annotations

import asyncio

from dataservice.sidecar.v1 import stream_pb2
from services.consumer_sidecar import carried_acks
from services.consumer_sidecar.carried_acks import AckOutbox


def test_answers_are_taken_once_by_their_client_and_those_committing_stay() -> None:
    async def body() -> None:
        now = [100.0]
        outbox = AckOutbox(clock=lambda: now[0])
        loop = asyncio.get_running_loop()
        first, second, other = (loop.create_future() for _ in range(3))
        outbox.add("c", 1, first)
        outbox.add("c", 2, second)
        outbox.add("d", 1, other)
        assert outbox.take("c") == []  # nothing committed yet
        second.set_result(stream_pb2.StreamAckResult(acked_count=2))
        assert [(a.seq, a.result.acked_count) for a in outbox.take("c")] == [(2, 2)]
        assert outbox.take("c") == []  # once
        first.set_result(stream_pb2.StreamAckResult(acked_count=1))
        assert [a.seq for a in outbox.take("c")] == [1]
        assert len(outbox) == 1 and outbox.take("x") == []
        other.set_exception(RuntimeError("a bug"))  # no answer: its client sends by Ack
        assert outbox.take("d") == [] and len(outbox) == 0

    asyncio.run(body())


def test_answers_nobody_takes_are_dropped_after_a_while_and_past_the_cap() -> None:
    async def body() -> None:
        now = [100.0]
        outbox = AckOutbox(clock=lambda: now[0])
        loop = asyncio.get_running_loop()
        for seq in range(carried_acks.MAX_ANSWERS_PER_CLIENT + 5):
            outbox.add("busy", seq + 1, loop.create_future())
        assert len(outbox) == carried_acks.MAX_ANSWERS_PER_CLIENT  # the oldest went first
        now[0] += carried_acks.ANSWER_KEEP_SECONDS + 1
        outbox.add("later", 1, loop.create_future())  # the sweep runs as answers come
        assert len(outbox) == 1

    asyncio.run(body())
