"""A Session's outgoing pipeline (groups.Connection): grants held back until durable."""

from __future__ import annotations

import asyncio

from dataservice.assigner.v1 import assigner_pb2
from services.assigner.groups import Connection


def grant(partition: int) -> assigner_pb2.SessionResponse:
    return assigner_pb2.SessionResponse(
        grant=assigner_pb2.LeaseGrant(topic="t", partition=partition, epoch=1)
    )


def test_a_stream_closed_while_a_grant_waits_for_its_write_ends_its_pump_quietly() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        errors: list[object] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        conn = Connection("a", "s")
        durable: asyncio.Future[bool] = loop.create_future()
        conn.send(grant(0), after=durable)
        pump = conn._pump
        assert pump is not None
        await asyncio.sleep(0)  # the pump waits for the write
        conn.close()  # the stream ended (the sidecar was lost) meanwhile
        durable.set_result(True)
        await asyncio.wait_for(asyncio.shield(pump), 5)
        assert pump.exception() is None and not errors
        assert conn.queue.get_nowait() is None  # only the end of the stream, no grant

    asyncio.run(run())


def test_grants_are_sent_in_order_once_durable() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        conn = Connection("a", "s")
        first: asyncio.Future[bool] = loop.create_future()
        conn.send(grant(0), after=first)
        conn.send(grant(1))  # held back behind the first
        assert conn.queue.empty()
        first.set_result(True)
        got = [await asyncio.wait_for(conn.queue.get(), 5) for _ in range(2)]
        assert [m.grant.partition for m in got if m is not None] == [0, 1]

    asyncio.run(run())
